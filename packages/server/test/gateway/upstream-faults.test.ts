import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { APIError } from 'openai';
import { createConcurrencyLimiter } from 'sluice';
import { expect, it } from 'vitest';
import { until } from '../harness/index.js';
import { startGatewayServer, upstreamOf } from './harness.js';

// An upstream that fails in the ways a provider (or the network before it) does: closing a
// new connection without an answer, cutting an answer short, answering twice the same header,
// sending an informational answer first, or not listening at all. The caller gets an answer it
// can tell from a whole one, the request is sent once, and the slot comes back each time.

const completion = (content: string) =>
  JSON.stringify({
    id: 'x',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  });

/** A gateway server in front of `upstream`, and whether its limiter has every slot back. */
async function gatewayBefore(upstream: string) {
  const limiter = createConcurrencyLimiter({ name: 'provider', maxConcurrent: 8 });
  const s = await startGatewayServer({ upstream, limiter });
  return { s, slotsBack: () => until(() => limiter.stats().active === 0, 'every slot back') };
}

const ask = { model: 'm', messages: [{ role: 'user' as const, content: 'q' }] };

/**
 * One chat completion through a gateway in front of an upstream that fails as `handle` does:
 * what the openai client threw, and how many requests reached the upstream, once every slot is back.
 */
async function askFailing(handle: (req: IncomingMessage, res: ServerResponse) => void) {
  const upstream = await upstreamOf(handle);
  const { s, slotsBack } = await gatewayBefore(upstream.url);
  const client = s.openai(await s.token({ tenant: 'failing' }));
  const failed = await client.chat.completions.create(ask).then(
    () => undefined,
    (error: unknown) => error,
  );
  await slotsBack();
  return { failed, requests: upstream.requests() };
}

it('a new connection closed after the request was read, with no answer: 502 in the API shape, and the request is not sent again', async () => {
  // The upstream took the request and went away (a crash): sending it again could run it twice.
  const { failed, requests } = await askFailing((req) => req.socket.destroy());
  expect(failed).toBeInstanceOf(APIError);
  expect((failed as APIError).status).toBe(502);
  expect(requests).toBe(1);
}, 120_000);

it('a new connection reset after the request was read: 502, and the request is not sent again', async () => {
  // A reset, as a proxy in front of a provider may send after taking the request: only a
  // connection that had carried answers before is worth a second try.
  const { failed, requests } = await askFailing((req) => req.socket.resetAndDestroy());
  expect((failed as APIError).status).toBe(502);
  expect(requests).toBe(1);
}, 120_000);

it('a new connection that began an answer and then failed: 502, and the request is not sent again', async () => {
  // Each of these upstreams read the request and started answering: it may have run it.
  const beginnings = {
    'a 103, then a crash': 'HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n',
    'half a status line, then a crash': 'HTTP/1.1 200 OK\r\ncontent-type: appl',
    // undici refuses an unasked-for 100 (it fails the socket): 502, where Node's client went on.
    'an unasked-for 100, then a whole answer': `HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}`,
  };
  for (const [name, bytes] of Object.entries(beginnings)) {
    const { failed, requests } = await askFailing((req) => {
      req.socket.write(bytes);
      setTimeout(() => req.socket.destroy(), 20);
    });
    expect({ name, status: (failed as APIError | undefined)?.status }).toEqual({ name, status: 502 });
    expect({ name, requests }).toEqual({ name, requests: 1 });
  }
}, 120_000);

it('a kept-alive connection reset under the next request (the idle-timeout race): sent again once, answered', async () => {
  const served = new WeakSet<object>();
  const upstream = await upstreamOf((req, res) => {
    if (served.has(req.socket)) return void req.socket.resetAndDestroy();
    served.add(req.socket);
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(completion(`answer ${upstream.requests()}`));
  });
  const { s, slotsBack } = await gatewayBefore(upstream.url);
  const client = s.openai(await s.token({ tenant: 'race' }));
  expect((await client.chat.completions.create(ask)).choices[0]!.message.content).toBe('answer 1');
  expect((await client.chat.completions.create(ask)).choices[0]!.message.content).toBe('answer 3');
  expect(upstream.requests()).toBe(3);
  await slotsBack();
}, 120_000);

it('an answer cut short by the upstream is cut short for the caller too, never ended as if whole', async () => {
  const body = completion('a whole answer');
  const upstream = await upstreamOf((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.write(body.slice(0, 20));
    setImmediate(() => res.socket?.destroy());
  });
  const { s, slotsBack } = await gatewayBefore(upstream.url);
  const token = await s.token({ tenant: 'cut' });
  const answer = await fetch(`${s.baseUrl('openai')}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(ask),
  });
  expect(answer.status).toBe(200);
  // The declared length is the upstream's: the caller's connection ends before it, an error.
  await expect(answer.text()).rejects.toThrow();
  await slotsBack();
}, 120_000);

it('an informational answer first, then the real one; a header sent twice reaches the caller as Node would give it', async () => {
  const body = completion('after hints');
  const upstream = await upstreamOf((_req, res) => {
    res.writeEarlyHints({ link: '</style.css>; rel=preload' });
    res.setHeader('x-ratelimit-remaining-requests', ['7', '9']);
    res.setHeader('content-type', 'application/json');
    res.end(body);
  });
  const { s, slotsBack } = await gatewayBefore(upstream.url);
  const token = await s.token({ tenant: 'hints' });
  const answer = await fetch(`${s.baseUrl('openai')}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(ask),
  });
  expect(answer.status).toBe(200);
  expect(answer.headers.get('x-ratelimit-remaining-requests')).toBe('7, 9');
  expect(await answer.text()).toBe(body);
  expect(upstream.requests()).toBe(1);
  await slotsBack();
}, 120_000);

it('an upstream that is not listening: 502 in each shape, and the slot comes back', async () => {
  // A port that was open a moment ago and is closed now.
  const gone = createServer();
  gone.listen(0, '127.0.0.1');
  await once(gone, 'listening');
  const port = (gone.address() as AddressInfo).port;
  await new Promise<void>((resolve) => gone.close(() => resolve()));
  const { s, slotsBack } = await gatewayBefore(`http://127.0.0.1:${port}/v1`);
  const token = await s.token({ tenant: 'down' });
  for (const name of ['openai', 'claude']) {
    const answer = await fetch(`${s.baseUrl(name)}/${name === 'openai' ? 'chat/completions' : 'messages'}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ ...ask, max_tokens: 5 }),
    });
    expect(answer.status).toBe(502);
    const error = (await answer.json()) as { error: { type: string } };
    expect(error.error.type).toBe(name === 'openai' ? 'upstream_unreachable' : 'api_error');
  }
  await slotsBack();
}, 120_000);
