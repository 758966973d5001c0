import { once } from 'node:events';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect, it } from 'vitest';
import { afterThisTest, deferred, until } from '../harness/index.js';
import { startGatewayServer, upstreamOf } from './harness.js';

// Item 6: a stream goes through as it comes. An upstream of the test's own sends one event,
// then waits for the test: the caller has that event before the rest exists. The usage is
// read from a copy, and the caller's bytes are the upstream's bytes.

const event = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`;
const chunk = (content: string) => ({
  id: 'c1',
  object: 'chat.completion.chunk',
  created: 1,
  model: 'm',
  choices: [{ index: 0, delta: { content }, finish_reason: null }],
});

async function startStepUpstream() {
  const rest = deferred<void>();
  const written: string[] = [];
  const { url } = await upstreamOf((_req, res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'x-ratelimit-remaining-requests': '99' });
    const send = (text: string) => {
      written.push(text);
      res.write(text);
    };
    send(event(chunk('first ')));
    void rest.promise.then(() => {
      send(event(chunk('and the rest')));
      // The usage event arrives split across writes, mid-line.
      const usage = event({
        ...chunk(''),
        choices: [],
        usage: { prompt_tokens: 31, completion_tokens: 9 },
      });
      send(usage.slice(0, 20));
      send(usage.slice(20));
      send('data: [DONE]\n\n');
      res.end();
    });
  });
  return { url, rest, written };
}

it('SSE passes through chunk by chunk, unbuffered, with X-Accel-Buffering: no; the usage comes from a copy', async () => {
  const upstream = await startStepUpstream();
  const s = await startGatewayServer({ upstream: upstream.url });
  const admin = await s.token({ tenant: 'streamer' });
  const { data: stream, response } = await s
    .openai(admin)
    .chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'go' }], stream: true })
    .withResponse();
  expect(response.headers.get('x-accel-buffering')).toBe('no');
  expect(response.headers.get('content-type')).toBe('text/event-stream');
  // The upstream's own headers come through (its rate-limit figures, say).
  expect(response.headers.get('x-ratelimit-remaining-requests')).toBe('99');
  const iterator = stream[Symbol.asyncIterator]();
  const first = await iterator.next();
  // The upstream has written one event and waits: the gateway held nothing back.
  expect(first.value?.choices[0]?.delta.content).toBe('first ');
  expect(upstream.written).toHaveLength(1);
  upstream.rest.resolve();
  const texts: string[] = [];
  for (let next = await iterator.next(); !next.done; next = await iterator.next())
    texts.push(next.value.choices[0]?.delta.content ?? '');
  expect(texts.join('')).toBe('and the rest');

  // The slot was released with the usage of the split event: the overview counts it.
  await until(async () => {
    const overview = await s.call('GET', '/ops/overview', undefined, admin);
    return overview.body.gateways?.[0]?.requests === 1;
  }, 'the request is counted');
  const overview = await s.call('GET', '/ops/overview', undefined, admin);
  expect(overview.body.gateways).toEqual([
    {
      tenant: 'streamer',
      gateway: 'openai',
      requests: 1,
      open: 0,
      statuses: { '2xx': 1 },
      inputTokens: 31,
      outputTokens: 9,
    },
  ]);
}, 240_000);

it('a stream whose upstream sends only its headers is open at the caller before the first event', async () => {
  // The gateway sends a stream's headers with the events that came in the same read; when none
  // came, it must send them alone, or a caller waits for the first event to see the stream open.
  const first = deferred<void>();
  const upstream = await upstreamOf((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders();
    void first.promise.then(() => res.end(event(chunk('late'))));
  });
  const s = await startGatewayServer({ upstream: upstream.url });
  const token = await s.token({ tenant: 'opened' });
  // fetch resolves on the response's headers: the upstream has sent no event yet, and sends
  // none until they come (headers held back, the two would wait on each other: the bound makes
  // that a quick failure rather than the test's timeout).
  const answer = await fetch(`${s.baseUrl('openai')}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: '{"stream":true}',
    signal: AbortSignal.timeout(30_000),
  });
  expect(answer.status).toBe(200);
  expect(answer.headers.get('x-accel-buffering')).toBe('no');
  first.resolve();
  expect(await answer.text()).toBe(event(chunk('late')));
}, 240_000);

it('the body of a JSON answer is the upstream body, byte for byte', async () => {
  const body =
    '{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"é ✓"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}  \n';
  const upstream = await upstreamOf((_req, res) =>
    res
      .writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
      .end(body),
  );
  const s = await startGatewayServer({ upstream: upstream.url });
  const token = await s.token({ tenant: 'bytes' });
  const answer = await fetch(`${s.baseUrl('openai')}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: '{}',
  });
  expect(await answer.text()).toBe(body);
  expect(answer.headers.get('content-length')).toBe(String(Buffer.byteLength(body)));
}, 240_000);

it('a kept-alive upstream socket closed under a request is retried once on a new connection', async () => {
  let requests = 0;
  const served = new WeakSet<object>();
  const server = createServer((req, res) => {
    requests++;
    // A socket that already served a request is closed as the next one arrives on it: the
    // race of an upstream's idle timeout with a request sent on the socket.
    if (served.has(req.socket)) return void req.socket.destroy();
    served.add(req.socket);
    req.resume();
    req.once('end', () => {
      const body = JSON.stringify({
        id: 'x',
        object: 'chat.completion',
        created: 1,
        model: 'm',
        choices: [
          { index: 0, message: { role: 'assistant', content: `answer ${requests}` }, finish_reason: 'stop' },
        ],
      });
      res
        .writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
        .end(body);
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  afterThisTest(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const s = await startGatewayServer({
    upstream: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
  });
  const client = s.openai(await s.token({ tenant: 'retry' }));
  const ask = () =>
    client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'q' }] });
  expect((await ask()).choices[0]!.message.content).toBe('answer 1');
  expect((await ask()).choices[0]!.message.content).toBe('answer 3');
  expect(requests).toBe(3);
}, 240_000);
