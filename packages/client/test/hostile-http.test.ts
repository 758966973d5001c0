import { describe, expect, it } from 'vitest';
import { RateLimitError, SluiceError, createClient } from '@sluice/client';
import { RUN_ID, json, run, startRawServer } from './raw-server.js';

// The JSON calls against a raw node:http server playing a broken proxy or a hostile server.

const refusal = { error: { type: 'agent_run_concurrency_limit', message: 'Too many runs' } };

/** The error a call rejects with (the test fails if it resolves). */
async function failureOf(call: Promise<unknown>): Promise<SluiceError> {
  const result = await call.then(
    (value) => ({ value }),
    (error: unknown) => ({ error }),
  );
  if (!('error' in result)) throw new Error(`Expected a rejection, got ${JSON.stringify(result.value)}`);
  return result.error as SluiceError;
}

describe('Retry-After', () => {
  const refusedWith = async (retryAfter: string | undefined, maxRetries = 0) => {
    const s = await startRawServer((req, res) =>
      json(res, 429, refusal, retryAfter === undefined ? {} : { 'retry-after': retryAfter }),
    );
    const sluice = createClient({ baseUrl: s.url, token: 't', maxRetries });
    return { error: await failureOf(sluice.runs.get(RUN_ID)), seen: s.seen };
  };

  it('as an HTTP date: the time until then', async () => {
    const at = new Date(Math.floor(Date.now() / 1000) * 1000 + 100_000);
    const { error } = await refusedWith(at.toUTCString());
    expect(error).toBeInstanceOf(RateLimitError);
    expect(error.retryAfterMs).toBeGreaterThan(90_000);
    expect(error.retryAfterMs).toBeLessThanOrEqual(100_000);
  });

  it('as seconds, fractions too', async () => {
    expect((await refusedWith('7')).error.retryAfterMs).toBe(7000);
    expect((await refusedWith(' 7 ')).error.retryAfterMs).toBe(7000);
    expect((await refusedWith('1.5')).error.retryAfterMs).toBe(1500);
  });

  it('negative or garbage: no figure (Date.parse would read "-5" or "soon 1" as a day in 2001 and retry at once)', async () => {
    for (const garbage of ['-5', 'soon', 'soon 1', '1e12', '', 'Infinity', '12abc']) {
      const { error } = await refusedWith(garbage);
      expect(error, garbage).toBeInstanceOf(RateLimitError);
      expect(error.retryAfterMs, garbage).toBeUndefined();
    }
  });

  it('garbage is retried after the backoff, not at once', async () => {
    const { error, seen } = await refusedWith('-5', 1);
    expect(error).toBeInstanceOf(RateLimitError);
    expect(seen).toHaveLength(2);
    expect(seen[1]!.at - seen[0]!.at).toBeGreaterThanOrEqual(498);
  });

  it('a huge figure (1e12 s) is not slept on, nor overflowed into an immediate retry: the error comes at once, with the figure', async () => {
    const { error, seen } = await refusedWith('1000000000000', 2);
    expect(error).toBeInstanceOf(RateLimitError);
    expect(error.retryAfterMs).toBe(1e15);
    expect(seen).toHaveLength(1);
  });

  it(
    'a wait longer than a minute is left to the caller: thrown at once, not retried',
    { timeout: 10_000 },
    async () => {
      const { error, seen } = await refusedWith('3600', 2);
      expect(error.retryAfterMs).toBe(3_600_000);
      expect(seen).toHaveLength(1);
    },
  );

  it("the body's retry_after_ms wins when it is a figure; a negative or non-number one is ignored", async () => {
    for (const [given, header, expected] of [
      [250, '9', 250],
      [-1, '9', 9000],
      ['5', '9', 9000],
      [Number.MAX_VALUE, undefined, Number.MAX_VALUE],
    ] as const) {
      const s = await startRawServer((req, res) =>
        json(
          res,
          429,
          { error: { ...refusal.error, retry_after_ms: given } },
          header === undefined ? {} : { 'retry-after': header },
        ),
      );
      const error = await failureOf(
        createClient({ baseUrl: s.url, token: 't', maxRetries: 0 }).runs.get(RUN_ID),
      );
      expect(error.retryAfterMs, String(given)).toBe(expected);
    }
  });

  it('a 429 without Retry-After: a RateLimitError without a figure, retried after a backoff', async () => {
    const once = await refusedWith(undefined);
    expect(once.error).toBeInstanceOf(RateLimitError);
    expect(once.error.retryAfterMs).toBeUndefined();
    const retried = await refusedWith(undefined, 1);
    expect(retried.seen).toHaveLength(2);
    expect(retried.seen[1]!.at - retried.seen[0]!.at).toBeGreaterThanOrEqual(498);
  });

  it('maxRetries 0: one request for a 429 and for a 503; a 500 is never retried', async () => {
    expect((await refusedWith('0')).seen).toHaveLength(1);
    for (const [status, maxRetries, calls] of [
      [503, 0, 1],
      [503, 2, 3],
      [500, 2, 1],
    ] as const) {
      const s = await startRawServer((req, res) =>
        json(res, status, { error: { type: 'x', message: 'no' } }, { 'retry-after': '0' }),
      );
      const error = await failureOf(
        createClient({ baseUrl: s.url, token: 't', maxRetries }).runs.get(RUN_ID),
      );
      expect(error.status).toBe(status);
      expect(s.seen, `${status} with maxRetries ${maxRetries}`).toHaveLength(calls);
    }
  });

  it('an abort during the sleep before a retry rejects at once with its reason and leaves no timer (the leak guard checks)', async () => {
    let answered!: () => void;
    const sent = new Promise<void>((resolve) => (answered = resolve));
    const s = await startRawServer((req, res) => {
      res.once('finish', answered);
      json(res, 429, refusal, { 'retry-after': '50' });
    });
    const controller = new AbortController();
    const reason = new Error('the user gave up');
    const call = createClient({ baseUrl: s.url, token: 't' }).runs.get(RUN_ID, { signal: controller.signal });
    await sent;
    controller.abort(reason);
    await expect(call).rejects.toBe(reason);
    expect(s.seen).toHaveLength(1);
  });
});

describe('bodies a proxy or a hostile server sends', () => {
  it('an HTML 502 from a proxy is a SluiceError with the status and a short message, not a SyntaxError', async () => {
    const page = `<html><head><title>502 Bad Gateway</title></head><body>${'x'.repeat(100_000)}</body></html>`;
    const s = await startRawServer((req, res) => {
      res.writeHead(502, { 'content-type': 'text/html' });
      res.end(page);
    });
    const error = await failureOf(createClient({ baseUrl: s.url, token: 't' }).runs.get(RUN_ID));
    expect(error).toBeInstanceOf(SluiceError);
    expect(error.status).toBe(502);
    expect(error.message).toContain('502 Bad Gateway');
    expect(error.message.length).toBeLessThan(1000);
  });

  it('an error body that never ends is read up to 64 KiB, not for ever', async () => {
    const s = await startRawServer((req, res) => {
      res.writeHead(502, { 'content-type': 'text/html' });
      const more = () => {
        while (res.write(`<p>${'x'.repeat(1000)}</p>`));
      };
      res.on('drain', more);
      more();
    });
    const error = await failureOf(createClient({ baseUrl: s.url, token: 't' }).runs.get(RUN_ID));
    expect(error).toMatchObject({ status: 502 });
    await s.seen[0]!.closed;
  });

  it('a redirect to another origin does not carry the token there', async () => {
    const other = await startRawServer((req, res) => json(res, 200, run('succeeded')));
    const s = await startRawServer((req, res) => {
      res.writeHead(307, { location: `${other.url}${req.url}` });
      res.end();
    });
    await createClient({ baseUrl: s.url, token: 'sk_secret' }).runs.get(RUN_ID);
    expect(s.seen[0]!.headers.authorization).toBe('Bearer sk_secret');
    expect(other.seen).toHaveLength(1);
    expect(other.seen[0]!.headers.authorization).toBeUndefined();
  });

  it('a 200 whose body is not JSON is a SluiceError with the status, not a SyntaxError', async () => {
    const s = await startRawServer((req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html>Sign in to the hotel wifi</html>');
    });
    const error = await failureOf(createClient({ baseUrl: s.url, token: 't' }).runs.get(RUN_ID));
    expect(error).toBeInstanceOf(SluiceError);
    expect(error).toMatchObject({ status: 200, type: 'invalid_response' });
    expect(error.cause).toBeInstanceOf(SyntaxError);
  });

  it('an error body whose fields are not strings: type, code and message are strings still', async () => {
    const s = await startRawServer((req, res) =>
      json(res, 400, { error: { type: 42, code: ['x'], message: { text: 'no' }, param: 7 } }),
    );
    const error = await failureOf(createClient({ baseUrl: s.url, token: 't' }).runs.get(RUN_ID));
    expect(error).toMatchObject({ status: 400, type: 'unknown', code: 'unknown', param: null });
    expect(typeof error.message).toBe('string');
  });

  it('__proto__ keys in a run and in an error body stay plain data', async () => {
    const s = await startRawServer((req, res, n) =>
      n === 0
        ? json(res, 200, `{"id":"${RUN_ID}","status":"succeeded","__proto__":{"polluted":true}}`)
        : json(res, 400, '{"error":{"__proto__":{"polluted":true},"type":"bad","message":"no"}}'),
    );
    const sluice = createClient({ baseUrl: s.url, token: 't' });
    const got = await sluice.runs.get(RUN_ID);
    expect(Object.getPrototypeOf(got)).toBe(Object.prototype);
    expect((got as unknown as { polluted?: boolean }).polluted).toBeUndefined();
    const error = await failureOf(sluice.runs.get(RUN_ID));
    expect(error).toMatchObject({ status: 400, type: 'bad' });
    expect(({} as { polluted?: boolean }).polluted).toBeUndefined();
  });

  it('threads.messages on a server whose cursor repeats: an error, not a loop for ever', async () => {
    const s = await startRawServer((req, res, n) =>
      json(res, 200, {
        object: 'list',
        data: [{ role: 'user', content: `m${n}`, run_id: null, created_at: 1 }],
        // Bounded here so that a client that loops ends the test instead of hanging it.
        next_cursor: n < 50 ? 'same' : null,
      }),
    );
    const got: unknown[] = [];
    const error = await failureOf(
      (async () => {
        for await (const m of createClient({ baseUrl: s.url, token: 't' }).threads.messages('thread_1'))
          got.push(m);
      })(),
    );
    expect(error).toBeInstanceOf(SluiceError);
    expect(error.message).toContain('same');
    // The first page, then the page after `same`, which names `same` again.
    expect(s.seen).toHaveLength(2);
    expect(got).toHaveLength(2);
  });

  it('runs.wait on a server that never holds the call polls with a growing pause, and an abort ends it at once with the reason', async () => {
    const s = await startRawServer((req, res) => json(res, 200, run('running')));
    const controller = new AbortController();
    const reason = new Error('stop waiting');
    const waiting = createClient({ baseUrl: s.url, token: 't' }).runs.wait(RUN_ID, {
      signal: controller.signal,
    });
    await expect.poll(() => s.seen.length).toBe(3);
    controller.abort(reason);
    await expect(waiting).rejects.toBe(reason);
    expect(s.seen[0]!.url).toBe(`/api/client/v1/agents/runs/${RUN_ID}?wait_ms=30000`);
    expect(s.seen[2]!.at - s.seen[1]!.at).toBeGreaterThan(s.seen[1]!.at - s.seen[0]!.at);
  });
});

describe('what a careless caller passes', () => {
  it('a baseUrl with a trailing slash, or with a path prefix (behind a proxy), reaches the same routes', async () => {
    const s = await startRawServer((req, res) => json(res, 200, run('succeeded')));
    await createClient({ baseUrl: `${s.url}/`, token: 't' }).runs.get(RUN_ID);
    await createClient({ baseUrl: `${s.url}/sluice//`, token: 't' }).runs.get(RUN_ID);
    expect(s.seen.map((r) => r.url)).toEqual([
      `/api/client/v1/agents/runs/${RUN_ID}`,
      `/sluice/api/client/v1/agents/runs/${RUN_ID}`,
    ]);
  });

  it('a baseUrl that is not an http(s) URL, or that has a query or a fragment, is refused by createClient', () => {
    for (const baseUrl of ['localhost:8787', 'ftp://h', 'http://h/?x=1', 'http://h/#top', '', 'http://']) {
      expect(() => createClient({ baseUrl, token: 't' }), baseUrl).toThrow(TypeError);
    }
    expect(() => createClient({ baseUrl: 'HTTP://127.0.0.1:1', token: 't' })).not.toThrow();
  });

  it('a token with CR LF (header injection) or none at all is refused by createClient, without echoing the token', () => {
    const secret = 'sk_secret\r\nX-Injected: 1';
    let thrown: unknown;
    try {
      createClient({ baseUrl: 'http://127.0.0.1:1', token: secret });
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(TypeError);
    expect((thrown as Error).message).toContain('token');
    expect((thrown as Error).message).not.toContain('sk_secret');
    for (const token of ['', ' ', 'a b', undefined, 42])
      expect(
        () => createClient({ baseUrl: 'http://127.0.0.1:1', token: token as string }),
        String(token),
      ).toThrow(TypeError);
  });

  it('runs.list({ limit: 2 }) sends the number (it was dropped without a word: only strings were sent)', async () => {
    const s = await startRawServer((req, res) =>
      json(res, 200, { object: 'list', data: [], next_cursor: null }),
    );
    const sluice = createClient({ baseUrl: s.url, token: 't' });
    await sluice.runs.list({ limit: 2, status: 'queued,running' });
    expect(s.seen[0]!.url).toBe('/api/client/v1/agents/runs?limit=2&status=queued%2Crunning');
    await expect(sluice.runs.list({ limit: { n: 2 } as unknown as number })).rejects.toThrow(TypeError);
  });

  it('an empty id, or "." and "..", is refused before any request (they would name another route)', async () => {
    const s = await startRawServer((req, res) =>
      json(res, 200, { object: 'list', data: [], next_cursor: null }),
    );
    const sluice = createClient({ baseUrl: s.url, token: 't' });
    for (const id of ['', '.', '..']) {
      await expect(sluice.runs.get(id), JSON.stringify(id)).rejects.toThrow(TypeError);
      await expect(sluice.runs.cancel(id), JSON.stringify(id)).rejects.toThrow(TypeError);
      await expect(sluice.threads.get(id), JSON.stringify(id)).rejects.toThrow(TypeError);
      await expect(sluice.runs.create(id, { input: 'x' }), JSON.stringify(id)).rejects.toThrow(TypeError);
    }
    expect(s.seen).toEqual([]);
  });
});
