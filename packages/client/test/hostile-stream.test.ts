import { describe, expect, it } from 'vitest';
import { SluiceError, createClient, type StreamEvent } from '@sluice/client';
import { readSse } from '../src/sse.js';
import { RUN_ID, cut, delta, frame, run, sse, startRawServer, write } from './raw-server.js';

// runs.stream against a raw node:http server playing a broken network or a hostile server.

const EVENTS = `/api/client/v1/agents/runs/${RUN_ID}/events`;

async function collect(events: AsyncIterable<StreamEvent>) {
  const seen: StreamEvent[] = [];
  try {
    for await (const e of events) seen.push(e);
    return { seen, error: undefined };
  } catch (error) {
    return { seen, error: error as Error };
  }
}

const texts = (events: StreamEvent[]) =>
  events.flatMap((e) => (e.event === 'message.delta' ? [e.data.text] : []));

const streamOf = (url: string) =>
  createClient({ baseUrl: url, token: 't', maxRetries: 0 }).runs.stream('a', { input: 'x' });

describe('runs.stream on a broken network', () => {
  it('a connection cut in the middle of an event: the half frame is not yielded, the resume asks after the last whole one', async () => {
    const s = await startRawServer(async (req, res, n) => {
      sse(res);
      if (n === 0) {
        await cut(
          res,
          frame(1, 'run.created', run('queued')) +
            frame(2, 'message.delta', delta('a')) +
            'id: 3\nevent: message.delta\ndata: {"run_id":"ru',
        );
      } else {
        res.end(frame(3, 'message.delta', delta('b')) + frame(4, 'run.completed', run('succeeded')));
      }
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => e.id)).toEqual([1, 2, 3, 4]);
    expect(texts(seen)).toEqual(['a', 'b']);
    expect(s.seen[1]).toMatchObject({ method: 'GET', url: EVENTS, headers: { 'last-event-id': '2' } });
  });

  it('a body that ends cleanly half-way through a frame is a drop too', async () => {
    const s = await startRawServer((req, res, n) => {
      sse(res);
      if (n === 0) res.end(frame(1, 'run.created', run('queued')) + 'id: 2\nevent: message.de');
      else res.end(frame(2, 'message.delta', delta('a')) + frame(3, 'run.completed', run('succeeded')));
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => e.id)).toEqual([1, 2, 3]);
    expect(s.seen[1]!.headers['last-event-id']).toBe('1');
  });

  it('a resume refused at the socket (the server restarting) is retried, not thrown as a bare fetch error', async () => {
    const s = await startRawServer(async (req, res, n) => {
      if (n === 1) return void req.socket.destroy();
      sse(res);
      if (n === 0) await cut(res, frame(1, 'run.created', run('queued')));
      else res.end(frame(2, 'run.completed', run('succeeded')));
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => e.id)).toEqual([1, 2]);
    expect(s.seen).toHaveLength(3);
  });

  it('drops without progress give up with a clear error after a bounded number of resumes, each waiting longer', async () => {
    const s = await startRawServer(async (req, res, n) => {
      sse(res);
      // Every resume answers the event the client has, then the connection drops again.
      await cut(res, frame(1, 'run.created', run('queued')));
      void n;
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(seen.map((e) => e.id)).toEqual([1]);
    expect(error).toBeInstanceOf(SluiceError);
    expect(error).toMatchObject({ type: 'stream_lost' });
    expect(error!.message).toContain(RUN_ID);
    const resumes = s.seen.slice(1);
    expect(resumes.length).toBe(5);
    for (const r of resumes) expect(r.headers['last-event-id']).toBe('1');
    // A backoff: each pause at least twice the one before, from 100 ms.
    const gaps = s.seen.slice(1).map((r, i) => r.at - s.seen[i]!.at);
    gaps.forEach((gap, i) => expect(gap).toBeGreaterThanOrEqual(100 * 2 ** i - 2));
  });

  it('a resume answered with events already yielded: each event is yielded once', async () => {
    const s = await startRawServer(async (req, res, n) => {
      sse(res);
      const first = frame(1, 'run.created', run('queued')) + frame(2, 'message.delta', delta('a'));
      if (n === 0) await cut(res, first);
      // This server ignores Last-Event-ID and sends the run from its start.
      else
        res.end(first + frame(3, 'message.delta', delta('b')) + frame(4, 'run.completed', run('succeeded')));
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => e.id)).toEqual([1, 2, 3, 4]);
    expect(texts(seen)).toEqual(['a', 'b']);
  });
});

describe('runs.stream on what a server sends', () => {
  it('a 200 that is not an event stream (a JSON run) is a SluiceError naming the content type, not an empty stream', async () => {
    const s = await startRawServer((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(run('succeeded')));
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(seen).toEqual([]);
    expect(error).toBeInstanceOf(SluiceError);
    expect(error).toMatchObject({ status: 200, type: 'invalid_response' });
    expect(error!.message).toContain('application/json');
  });

  it('a resume answered 200 text/html (a captive portal) fails at once, not after five more tries', async () => {
    const s = await startRawServer(async (req, res, n) => {
      if (n === 0) {
        sse(res);
        return cut(res, frame(1, 'run.created', run('queued')));
      }
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html><body>Sign in to the hotel wifi</body></html>');
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(seen.map((e) => e.id)).toEqual([1]);
    expect(error).toMatchObject({ status: 200, type: 'invalid_response' });
    expect(error!.message).toContain('text/html');
    expect(s.seen).toHaveLength(2);
  });

  it('CRLF and lone CR line endings, comments, a retry: field and multi-line data, split at every byte', async () => {
    const body =
      ': hello\r\nretry: 10\r\n\r\n' +
      'id: 1\r\nevent: run.created\r\ndata: ' +
      JSON.stringify(run('queued')) +
      '\r\n\r\n' +
      ': keep-alive\r\r' +
      'id: 2\revent: message.delta\rdata: {"run_id":"x",\rdata: "text":"a"}\r\r' +
      'id: 3\nevent: run.completed\ndata: ' +
      JSON.stringify(run('succeeded')) +
      '\n\n';
    const s = await startRawServer(async (req, res) => {
      sse(res);
      // Each byte its own chunk: a CR and its LF arrive apart.
      for (const ch of body) await write(res, ch);
      res.end();
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => [e.id, e.event])).toEqual([
      [1, 'run.created'],
      [2, 'message.delta'],
      [3, 'run.completed'],
    ]);
    expect(texts(seen)).toEqual(['a']);
  });

  it('the parser, chunk by chunk: a CR at the end of one chunk and its LF at the start of the next end one line, not a frame', async () => {
    const chunks = ['id: 1\r', '\nevent: message.delta\r', '\ndata: {"text":"a"}\r', '\n\r', '\n'];
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (const c of chunks) controller.enqueue(new TextEncoder().encode(c));
        controller.close();
      },
    });
    const events = [];
    for await (const e of readSse(body)) events.push(e);
    expect(events).toEqual([{ id: '1', event: 'message.delta', data: '{"text":"a"}' }]);
  });

  it('an id: on a frame with no data (a comment-only frame) moves the resume point, as EventSource does, and yields nothing', async () => {
    const s = await startRawServer(async (req, res, n) => {
      sse(res);
      if (n === 0) await cut(res, frame(1, 'run.created', run('queued')) + 'id: 2\n: nothing to show\n\n');
      else res.end(frame(3, 'run.completed', run('succeeded')));
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => e.id)).toEqual([1, 3]);
    expect(s.seen[1]!.headers['last-event-id']).toBe('2');
  });

  it("the server's retry: field sets the pause before a resume", async () => {
    const s = await startRawServer(async (req, res, n) => {
      sse(res);
      if (n === 0) await cut(res, 'retry: 400\n\n' + frame(1, 'run.created', run('queued')));
      else res.end(frame(2, 'run.completed', run('succeeded')));
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(seen.map((e) => e.id)).toEqual([1, 2]);
    expect(s.seen[1]!.at - s.seen[0]!.at).toBeGreaterThanOrEqual(398);
  });

  it('event data that is not JSON is a SluiceError saying so, not a resume loop', async () => {
    const s = await startRawServer(async (req, res) => {
      sse(res);
      await cut(res, frame(1, 'run.created', run('queued')) + 'id: 2\nevent: message.delta\ndata: {oops\n\n');
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(seen.map((e) => e.id)).toEqual([1]);
    expect(error).toMatchObject({ type: 'invalid_response' });
    expect(error!.message).toContain('message.delta');
    expect(s.seen).toHaveLength(1);
  });

  it('__proto__ keys in event data stay plain data', async () => {
    const s = await startRawServer((req, res) => {
      sse(res);
      res.end(
        frame(1, 'run.created', run('queued')) +
          'id: 2\nevent: message.delta\ndata: {"run_id":"x","text":"a","__proto__":{"polluted":true}}\n\n' +
          frame(3, 'run.completed', run('succeeded')),
      );
    });
    const { seen, error } = await collect(streamOf(s.url));
    expect(error).toBeUndefined();
    expect(({} as { polluted?: boolean }).polluted).toBeUndefined();
    expect(Object.getPrototypeOf(seen[1]!.data)).toBe(Object.prototype);
    expect((seen[1]!.data as { polluted?: boolean }).polluted).toBeUndefined();
  });
});

describe('runs.stream and an AbortSignal', () => {
  it('an abort while the stream waits for its next event rejects with the reason and closes the connection', async () => {
    const s = await startRawServer(async (req, res) => {
      sse(res);
      await write(res, frame(1, 'run.created', run('queued')));
    });
    const controller = new AbortController();
    const reason = new Error('the user left');
    const events = createClient({ baseUrl: s.url, token: 't' }).runs.stream(
      'a',
      { input: 'x' },
      { signal: controller.signal },
    );
    const it = events[Symbol.asyncIterator]();
    expect((await it.next()).value).toMatchObject({ id: 1, event: 'run.created' });
    const next = it.next();
    controller.abort(reason);
    await expect(next).rejects.toBe(reason);
    await s.seen[0]!.closed;
  });

  it('an abort during the pause before a resume rejects at once with the reason', async () => {
    const s = await startRawServer(async (req, res) => {
      sse(res);
      await cut(res, 'retry: 60000\n\n' + frame(1, 'run.created', run('queued')));
    });
    const controller = new AbortController();
    const reason = new Error('enough');
    const events = createClient({ baseUrl: s.url, token: 't' }).runs.stream(
      'a',
      { input: 'x' },
      { signal: controller.signal },
    );
    const it = events[Symbol.asyncIterator]();
    expect((await it.next()).value).toMatchObject({ id: 1 });
    const next = it.next();
    await s.seen[0]!.closed;
    controller.abort(reason);
    await expect(next).rejects.toBe(reason);
    expect(s.seen).toHaveLength(1);
  });
});
