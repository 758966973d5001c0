import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setImmediate as flush } from 'node:timers/promises';
import { expect, it } from 'vitest';
import { ManualClock, createConcurrencyLimiter } from 'sluice/concurrency';
import { afterThisTest, deferred, until } from '../harness/index.js';
import { startGatewayServer } from './harness.js';

// The upstream's rate-limit headers come with its answer's start, the release with its end.
// A stream that outlives the window its headers describe must not tell the limiter, at the
// end, that the window is empty now.

const event = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`;
const chunk = (content: string) => ({
  id: 'c1',
  object: 'chat.completion.chunk',
  created: 1,
  model: 'm',
  choices: [{ index: 0, delta: { content }, finish_reason: null }],
});

/** Sends the headers of an answer that took the minute's last tokens (back in 30 s), then waits. */
async function startExhaustingUpstream() {
  const rest = deferred<void>();
  const server = createServer((req, res) => {
    req.resume();
    req.once('end', () => {
      res.writeHead(200, {
        'content-type': 'text/event-stream',
        'x-ratelimit-limit-tokens': '60000',
        'x-ratelimit-remaining-tokens': '0',
        'x-ratelimit-reset-tokens': '30s',
      });
      res.write(event(chunk('first ')));
      void rest.promise.then(() => {
        res.write(event({ ...chunk(''), choices: [], usage: { prompt_tokens: 31, completion_tokens: 9 } }));
        res.end('data: [DONE]\n\n');
      });
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  afterThisTest(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, rest };
}

it('a stream that ends after its window reset neither pauses the limiter nor empties its token budget', async () => {
  const clock = new ManualClock(Date.now());
  const limiter = createConcurrencyLimiter({
    name: 'provider',
    maxConcurrent: 8,
    rate: { tokensPerMinute: 60_000 },
    clock,
  });
  const upstream = await startExhaustingUpstream();
  const s = await startGatewayServer({ upstream: upstream.url, limiter, clock });
  const token = await s.token({ tenant: 'streamer' });
  const stream = await s
    .openai(token)
    .chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'go' }], stream: true });
  const iterator = stream[Symbol.asyncIterator]();
  expect((await iterator.next()).value?.choices[0]?.delta.content).toBe('first ');
  clock.advance(45_000); // the window of the headers reset 15 s ago
  upstream.rest.resolve();
  while (!(await iterator.next()).done);
  await until(() => limiter.stats().active === 0, 'the slot is released');

  const next = limiter.acquire({});
  let granted = false;
  void next.then(() => (granted = true));
  await flush();
  expect(granted).toBe(true);
  expect(limiter.stats().budgets?.tokens?.available).toBeGreaterThan(50_000);
  await limiter.release(await next);
});
