import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { getEventListeners } from 'node:events';
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from 'node:zlib';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { observeResponses } from '../../src/models/response-observer.js';

// A provider request (a `fetch` made inside an observed context, as the SDKs make them) is sent
// with undici's `request`, not Node's `fetch`. What the SDK reads must not change: each case
// here holds the answer to what Node's `fetch` gives for the same exchange, or to what `fetch`
// is specified to do where the server misbehaves.

/** A JSON answer `{ packed: name }`, encoded by `pack` and labelled with `encoding`. */
const packedJson =
  (encoding: string, pack: (body: string) => Buffer, name: string) =>
  (_req: IncomingMessage, res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': encoding });
    res.end(pack(JSON.stringify({ packed: name })));
  };

let server: Server;
let base: string;
/** Requests the server has seen close, by path. */
const closed: string[] = [];
const waiters = new Map<string, () => void>();
const heard = new Map<
  string,
  { method: string; url: string; headers: IncomingMessage['headers']; body: string }
>();

const routes: Record<string, (req: IncomingMessage, res: ServerResponse) => void> = {
  '/echo': (req, res) => {
    res.writeHead(201, 'Made It', [
      ['content-type', 'application/json'],
      ['set-cookie', 'a=1'],
      ['set-cookie', 'b=2'],
      ['x-ratelimit-remaining-requests', '7'],
    ]);
    res.end(JSON.stringify({ ok: true }));
  },
  '/stall-head': () => undefined,
  '/stall-body': (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: one\n\n');
  },
  '/cut': (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: one\n\n', () => setImmediate(() => req.socket.destroy()));
  },
  '/gzip': packedJson('gzip', gzipSync, 'gzip'),
  '/br': packedJson('br', brotliCompressSync, 'br'),
  '/gzip-cut': (_req, res) => {
    // The gzip trailer (CRC and length) missing: fetch still gives the text.
    res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
    res.end(gzipSync(JSON.stringify({ packed: 'gzip-cut' })).subarray(0, -8));
  },
  '/gzip-empty': (_req, res) => {
    // A proxy's refusal: typed gzip, no body.
    res.writeHead(429, { 'content-encoding': 'gzip' });
    res.end();
  },
  '/deflate-raw': packedJson('deflate', deflateRawSync, 'deflate-raw'),
  '/deflate': packedJson('deflate', deflateSync, 'deflate'),
  '/gzip-br': packedJson('gzip, br', (b: string) => brotliCompressSync(gzipSync(b)), 'gzip-br'),
  '/gzip-corrupt': (_req, res) => {
    // Not gzip at all, and it never ends: the decoder fails, and the request must end with it.
    res.writeHead(200, { 'content-encoding': 'gzip' });
    res.write('this is not gzip');
    const more = setInterval(() => res.write(Buffer.alloc(16_384)), 5);
    res.on('close', () => clearInterval(more));
  },
  '/600': (_req, res) => {
    res.writeHead(600);
    res.end('nonsense');
  },
  '/auth': (req, res) => {
    res.end(req.headers.authorization ?? '(none)');
  },
  '/redirect': (_req, res) => {
    res.writeHead(307, { location: '/echo' });
    res.end();
  },
  '/empty': (_req, res) => {
    res.writeHead(204);
    res.end();
  },
};

beforeAll(async () => {
  server = createServer((req, res) => {
    const path = new URL(req.url!, 'http://x').pathname;
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      heard.set(path, {
        method: req.method!,
        url: req.url!,
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      });
      routes[path]!(req, res);
    });
    res.on('close', () => {
      closed.push(path);
      waiters.get(path)?.();
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  server.close();
  await once(server, 'close');
});

const observed = <T>(body: () => Promise<T>) => observeResponses(() => undefined, body);
const closedSoon = (path: string) =>
  new Promise<void>((resolve) => (closed.includes(path) ? resolve() : waiters.set(path, resolve)));
async function readAll(response: Response): Promise<string> {
  return new TextDecoder().decode(await response.arrayBuffer());
}

it('answers as Node fetch does: status, status text, headers, repeated headers, body, url', async () => {
  const init = {
    method: 'post',
    headers: new Headers({ authorization: 'Bearer k', 'x-extra': 'e' }),
    body: 'plain text',
  };
  const viaFetch = await fetch(`${base}/echo?q=1`, init);
  const seenByFetch = heard.get('/echo')!;
  const viaProvider = await observed(() => fetch(`${base}/echo?q=1`, init));
  const seenByProvider = heard.get('/echo')!;
  const shape = async (r: Response) => ({
    status: r.status,
    statusText: r.statusText,
    ok: r.ok,
    url: r.url,
    type: r.headers.get('content-type'),
    cookies: r.headers.getSetCookie(),
    limit: r.headers.get('x-ratelimit-remaining-requests'),
    body: await readAll(r),
  });
  const a = await shape(viaFetch);
  expect(await shape(viaProvider)).toEqual({ ...a, statusText: 'Created' });
  // The server's own reason phrase is not kept ("Made It"): the standard text for the status is given.
  expect(a.statusText).toBe('Made It');
  // What the server heard: the same method, path, query, body and the caller's headers; a text body
  // without a type typed as fetch types it.
  for (const seen of [seenByFetch, seenByProvider])
    expect(seen).toMatchObject({
      method: 'POST',
      url: '/echo?q=1',
      body: 'plain text',
      headers: {
        authorization: 'Bearer k',
        'x-extra': 'e',
        'content-type': 'text/plain;charset=UTF-8',
        'content-length': '10',
      },
    });
});

// That an abort is known in its own turn, before what runs after it, as with fetch, is held by
// nesting.test.ts (C34: a child run's cancellation reaches it before its parent's ends).
it('an abort before the answer rejects with the reason, and the request is closed at the server', async () => {
  const controller = new AbortController();
  const pending = observed(() =>
    fetch(`${base}/stall-head`, { method: 'POST', body: '{}', signal: controller.signal }),
  );
  await expect.poll(() => heard.has('/stall-head')).toBe(true);
  const reason = new Error('the run was cancelled');
  controller.abort(reason);
  await expect(pending).rejects.toBe(reason);
  await closedSoon('/stall-head');
});

it('an abort while the body streams errors the reader with the reason, and closes the request', async () => {
  const controller = new AbortController();
  const response = await observed(() => fetch(`${base}/stall-body`, { signal: controller.signal }));
  const reader = response.body!.getReader();
  expect(new TextDecoder().decode((await reader.read()).value)).toBe('data: one\n\n');
  const next = reader.read();
  const reason = new Error('lease lost');
  controller.abort(reason);
  await expect(next).rejects.toBe(reason);
  await closedSoon('/stall-body');
});

it('a connection cut in the body errors the reader with TypeError("terminated"), as fetch does', async () => {
  const viaFetch = await fetch(`${base}/cut`);
  const fetchError = await readAll(viaFetch).catch((e: unknown) => e);
  const viaProvider = await observed(() => fetch(`${base}/cut`));
  const providerError = await readAll(viaProvider).catch((e: unknown) => e);
  for (const error of [fetchError, providerError]) {
    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toBe('terminated');
  }
});

it('a server that is not there rejects with TypeError("fetch failed"), its cause the refusal', async () => {
  const probe = createServer();
  probe.listen(0, '127.0.0.1');
  await once(probe, 'listening');
  const { port } = probe.address() as AddressInfo;
  probe.close();
  await once(probe, 'close');
  const error = (await observed(() =>
    fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: 'POST', body: '{}' }),
  ).catch((e: unknown) => e)) as TypeError & { cause: { code?: string } };
  expect(error).toBeInstanceOf(TypeError);
  expect(error.message).toBe('fetch failed');
  expect(error.cause.code).toBe('ECONNREFUSED');
});

it.each(['gzip', 'br', 'deflate', 'deflate-raw', 'gzip-br', 'gzip-cut'])(
  'a %s answer is decoded, as fetch decodes it',
  async (coding) => {
    const viaFetch = await readAll(await fetch(`${base}/${coding}`));
    const response = await observed(() => fetch(`${base}/${coding}`));
    expect(JSON.parse(await readAll(response))).toEqual({ packed: coding });
    expect(JSON.parse(viaFetch)).toEqual({ packed: coding });
  },
);

it('an empty body typed gzip reads as empty, and a HEAD has no body', async () => {
  const refused = await observed(() => fetch(`${base}/gzip-empty`));
  expect([refused.status, await readAll(refused)]).toEqual([429, '']);
  const head = await observed(() => fetch(`${base}/gzip`, { method: 'HEAD' }));
  expect([head.status, head.body]).toEqual([200, null]);
});

it('a body that fails to decode errors the reader and ends the request at the server', async () => {
  const response = await observed(() => fetch(`${base}/gzip-corrupt`));
  const error = (await readAll(response).catch((e: unknown) => e)) as Error;
  expect([error.constructor, error.message]).toEqual([TypeError, 'terminated']);
  await closedSoon('/gzip-corrupt');
});

it('a status no Response can carry (600) fails as a broken answer, and the request is ended', async () => {
  const error = (await observed(() => fetch(`${base}/600`)).catch((e: unknown) => e)) as TypeError & {
    cause: Error;
  };
  expect([error.constructor, error.message, error.cause.message]).toEqual([
    TypeError,
    'fetch failed',
    'status 600 is not an HTTP status',
  ]);
  await closedSoon('/600');
});

it('headers given as a Map are sent; one signal for many requests leaves no listener and no warning', async () => {
  const viaMap = await observed(() =>
    fetch(`${base}/auth`, {
      headers: new Map([['authorization', 'Bearer m']]) as unknown as RequestInit['headers'],
    }),
  );
  expect(await readAll(viaMap)).toBe('Bearer m');
  const warnings: Error[] = [];
  const onWarning = (w: Error) => warnings.push(w);
  process.on('warning', onWarning);
  try {
    const one = new AbortController();
    const open = await Promise.all(
      Array.from({ length: 20 }, () => observed(() => fetch(`${base}/auth`, { signal: one.signal }))),
    );
    await Promise.all(open.map(readAll));
    expect(getEventListeners(one.signal, 'abort')).toHaveLength(0);
    await new Promise((r) => setImmediate(r));
    expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
  } finally {
    process.off('warning', onWarning);
  }
});

it('a redirect is followed, and a 204 has no body', async () => {
  const redirected = await observed(() => fetch(`${base}/redirect`, { method: 'POST', body: 'again' }));
  expect([redirected.status, await readAll(redirected)]).toEqual([201, '{"ok":true}']);
  expect(heard.get('/echo')!.body).toBe('again');
  const empty = await observed(() => fetch(`${base}/empty`));
  expect([empty.status, empty.body]).toEqual([204, null]);
});

it('what this path does not send itself (a Request, a streamed body) goes to fetch, unchanged', async () => {
  const fromRequest = await observed(() =>
    fetch(new Request(`${base}/echo`, { method: 'POST', body: 'as a request' })),
  );
  expect([fromRequest.status, heard.get('/echo')!.body]).toEqual([201, 'as a request']);
  const streamed = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('streamed'));
      c.close();
    },
  });
  const fromStream = await observed(() =>
    fetch(`${base}/echo`, { method: 'POST', body: streamed, duplex: 'half' } as RequestInit),
  );
  expect([fromStream.status, heard.get('/echo')!.body]).toEqual([201, 'streamed']);
  await readAll(fromRequest);
  await readAll(fromStream);
});
