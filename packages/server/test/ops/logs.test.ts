import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { lastUserText, ownStandIn, startTestServer, until } from '../helpers.js';

// One server in this process whose pino stream is captured: every line is parsed, each request's
// lines carry its id, and a token and a prompt marker sent every way a client can send them
// (body, query string, headers, on success and on the error paths) are in none of them.

const marker = `PROMPT-MARKER-${randomBytes(8).toString('hex')}`;
let output = '';
let server: RunningServer;
let provider: ProviderStandIn;
let admin: string;

interface Line {
  level: number;
  msg?: string;
  reqId?: string;
  req?: { url: string; method: string };
  res?: { statusCode: number };
  [key: string]: unknown;
}
const lines = (): Line[] =>
  output
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);

beforeAll(async () => {
  provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => {
        const text = lastUserText(r);
        // A provider whose error quotes the input back, as real ones do.
        if (text.includes('fail')) return { status: 400, message: `cannot answer "${text}"` };
        return { text: `done ${text}` };
      },
    }),
  );
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      output += chunk.toString();
      done();
    },
  });
  const t = await startTestServer({ provider, logger: { level: 'info', stream } });
  server = t.server;
  admin = t.admin;
});

async function request(
  path: string,
  init: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<{ status: number; id: string; body: string }> {
  const response = await fetch(`${server.url}${path}`, {
    method: init.method ?? 'GET',
    headers: init.headers,
    body: init.body,
  });
  const body = await response.text();
  const id = response.headers.get('x-request-id') ?? '';
  // The completion line is written as the response ends, which may be after the client has it.
  await until(() => lines().some((l) => l.reqId === id && l.msg === 'request completed'), `log of ${path}`);
  return { status: response.status, id, body };
}

const runs = '/api/client/v1/agents/echo/runs';
const json = { 'content-type': 'application/json' };

describe('server logs', () => {
  it('are JSON lines with the request id on every line of a request; no token, secret or prompt in any of them', async () => {
    const bad = `sk_${randomBytes(24).toString('base64url')}`;
    const secretHeaders = {
      authorization: `Bearer ${admin}`,
      'x-api-key': admin,
      cookie: `session=${admin}`,
      'x-prompt': marker,
    };

    // Success, with a caller's request id that is short and plain: kept and echoed.
    const ok = await request(runs, {
      method: 'POST',
      headers: { ...json, ...secretHeaders, 'x-request-id': 'lb-7f3a.01' },
      body: JSON.stringify({ input: `${marker} hello`, metadata: { note: marker } }),
    });
    expect(ok.status).toBe(200);
    expect(JSON.parse(ok.body)).toMatchObject({ status: 'succeeded' });
    expect(ok.id).toBe('lb-7f3a.01');

    // A caller's id that is too long or has odd characters is replaced by a generated one.
    const long = await request('/readyz', { headers: { 'x-request-id': 'a'.repeat(65) } });
    expect(long.id).toMatch(/^[0-9a-f-]{36}$/);
    const odd = await request('/readyz', { headers: { 'x-request-id': `id"}{${marker}` } });
    expect(odd.id).toMatch(/^[0-9a-f-]{36}$/);

    // 400s: a body that is not JSON (the parser's message quotes it), one that fails the schema.
    const broken = await request(runs, {
      method: 'POST',
      headers: { ...json, ...secretHeaders },
      body: `{"input": "${marker}`,
    });
    expect(broken.status).toBe(400);
    const invalid = await request(runs, {
      method: 'POST',
      headers: { ...json, ...secretHeaders },
      body: JSON.stringify({ input: marker, class: marker }),
    });
    expect(invalid.status).toBe(400);

    // 401s: an unknown token in the header, a real one in the query string (as the WebSocket
    // route takes it), and the marker in the query too.
    const refused = await request(runs, {
      method: 'POST',
      headers: { ...json, authorization: `Bearer ${bad}` },
      body: JSON.stringify({ input: marker }),
    });
    expect(refused.status).toBe(401);
    const query = await request(`/api/client/v1/agents/runs?access_token=${admin}&q=${marker}&token=${bad}`);
    expect(query.status).toBe(401);

    // A failing agent: the provider's error quotes the prompt.
    const failed = await request(runs, {
      method: 'POST',
      headers: { ...json, ...secretHeaders },
      body: JSON.stringify({ input: `${marker} fail now` }),
    });
    expect(JSON.parse(failed.body)).toMatchObject({ status: 'failed' });

    const all = lines();
    for (const { id } of [ok, long, odd, broken, invalid, refused, query, failed]) {
      const own = all.filter((l) => l.reqId === id);
      expect(own.map((l) => l.msg)).toEqual(
        expect.arrayContaining(['incoming request', 'request completed']),
      );
    }
    // Every line about a request names it.
    for (const line of all) if (line.req || line.res) expect(line.reqId).toEqual(expect.any(String));
    // The query is logged without its secrets.
    const logged = all.find((l) => l.reqId === query.id && l.req)!.req!.url;
    expect(logged).toContain('access_token=[redacted]');
    expect(logged).toContain('q=[redacted]&token=[redacted]');
    // The failure is logged (the test could not pass by logging nothing), under its run.
    expect(all.some((l) => l.msg === 'agent failed')).toBe(true);

    for (const secret of [admin, bad, marker, 'PROMPT-MARKER']) expect(output).not.toContain(secret);
  });

  it('scrub bearer tokens, Sluice secrets, URL passwords and secret query values from any message, and redact secret fields', async () => {
    const token = `sk_${randomBytes(24).toString('base64url')}`;
    const before = output.length;
    server.fastify.log.warn(
      {
        databaseUrl: 'postgres://sluice:db-pass-1@db:5432/sluice',
        config: { signing_secret: 'whsec_abc', REDIS_URL: 'redis://:redis-pass-2@cache:6379' },
        run: { input: marker },
      },
      `callback to https://hook.example/cb?sig=sig-value-3&x=1 failed; sent Bearer ${token} and ${token}; redis redis://u:redis-pass-4@cache:6379/0`,
    );
    // A signing secret and Basic credentials inside a message are scrubbed too.
    server.fastify.log.warn(
      'secret whsec_c2lnbmluZy1zZWNyZXQtNQ== rejected; proxy sent Authorization: Basic YmFzaWMtcGFzcy02',
    );
    const written = output.slice(before);
    const line = JSON.parse(written.split('\n')[0]!) as Line;
    expect(line.databaseUrl).toBe('[redacted]');
    expect(line.config).toEqual({ signing_secret: '[redacted]', REDIS_URL: '[redacted]' });
    expect(line.run).toEqual({ input: '[redacted]' });
    expect(line.msg).toContain('sig=[redacted]&x=1');
    expect(line.msg).toContain('Bearer [redacted]');
    expect(line.msg).toContain('redis://u:[redacted]@cache:6379/0');
    for (const secret of [
      token,
      'db-pass-1',
      'whsec_abc',
      'redis-pass-2',
      'sig-value-3',
      'redis-pass-4',
      'c2lnbmluZy1zZWNyZXQtNQ',
      'YmFzaWMtcGFzcy02',
      marker,
    ])
      expect(written).not.toContain(secret);
  });
});
