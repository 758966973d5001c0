import OpenAI from 'openai';
import { expect, it } from 'vitest';
import { createConcurrencyLimiter, type ConcurrencyLimiter } from 'sluice';
import { ManualClock } from 'sluice/concurrency';
import type { StandInRequest } from '@sluice/testkit';
import { until } from '../harness/index.js';
import { heldReplies, startGatewayServer } from './harness.js';

// Item 5: the gateway is the fence. The upstream request lives exactly as long as the caller,
// the slot and the server's drain allow; a stand-in stream that never ends shows each cut.

const lastText = (r: StandInRequest) => String(r.messages.at(-1)?.content ?? '');

/** Opens a stream that the stand-in starts and never ends; resolves once its first chunk came. */
async function openEndlessStream(client: OpenAI, signal?: AbortSignal) {
  const stream = await client.chat.completions.create(
    { model: 'm', messages: [{ role: 'user', content: 'stall forever' }], stream: true },
    { signal },
  );
  const iterator = stream[Symbol.asyncIterator]();
  const first = await iterator.next();
  expect(first.done).toBe(false);
  return iterator;
}

it('a caller that disconnects aborts the upstream request and frees the slot', async () => {
  const limiter = createConcurrencyLimiter({ name: 'one', maxConcurrent: 1 });
  const s = await startGatewayServer({ limiter, standIn: { reply: () => ({ stall: true }) } });
  const client = s.openai(await s.token({ tenant: 'acme' }));
  const controller = new AbortController();
  await openEndlessStream(client, controller.signal);
  expect(s.provider.inFlight).toBe(1);
  expect(limiter.stats().active).toBe(1);
  controller.abort();
  await until(() => s.provider.inFlight === 0, 'the provider sees its client leave');
  expect(s.provider.requests[0]!.aborted).toBe(true);
  await until(() => limiter.stats().active === 0, 'the slot is free');
  // The freed slot serves the next caller at once (a limiter of 1 would hold it otherwise).
  const next = await openEndlessStream(client);
  expect(limiter.stats().active).toBe(1);
  await next.return?.();
}, 240_000);

it('a lost lease aborts the upstream request and cuts the stream', async () => {
  const clock = new ManualClock();
  const inner: ConcurrencyLimiter<string> = createConcurrencyLimiter({
    name: 'fenced',
    maxConcurrent: 2,
    leaseTtlMs: 3_000,
    clock,
  });
  // A limiter that no longer knows the lease when asked to renew it (expired, taken over).
  const forgetful: ConcurrencyLimiter<string> = {
    name: 'fenced',
    acquire: (request) => inner.acquire(request),
    renew: async () => undefined,
    release: (lease, details) => inner.release(lease, details),
    stats: () => inner.stats!(),
  };
  const s = await startGatewayServer({
    limiter: forgetful,
    clock,
    standIn: { reply: () => ({ stall: true }) },
  });
  const client = s.openai(await s.token({ tenant: 'acme' }));
  const stream = await openEndlessStream(client);
  expect(s.provider.inFlight).toBe(1);
  // The slot renews at a third of its TTL; the renewal finds the lease gone.
  clock.advance(1_000);
  await until(() => s.provider.inFlight === 0, 'the upstream request is stopped');
  expect(s.provider.requests[0]!.aborted).toBe(true);
  await expect(stream.next()).rejects.toThrow();
}, 240_000);

it('a drain refuses new gateway requests with 503, lets open ones finish, and cuts what is left at the drain time', async () => {
  const gate = heldReplies({ text: 'finished during the drain', usage: { input: 1, output: 1 } });
  const s = await startGatewayServer({
    settings: { drainTimeoutMs: 500 },
    standIn: { reply: (r) => (lastText(r).includes('stall') ? { stall: true } : gate.reply()) },
  });
  const client = s.openai(await s.token({ tenant: 'acme' }));
  const endless = await openEndlessStream(client);
  const open = client.chat.completions.create({
    model: 'm',
    messages: [{ role: 'user', content: 'finish me' }],
  });
  await until(() => gate.held.length === 1, 'the second request reaches the provider');

  const drained = s.server.drain();
  const refused = await client.chat.completions
    .create({ model: 'm', messages: [{ role: 'user', content: 'too late' }] })
    .catch((e: unknown) => e as InstanceType<typeof OpenAI.APIError>);
  expect(refused).toBeInstanceOf(OpenAI.InternalServerError);
  expect(refused).toMatchObject({ status: 503, error: { type: 'server_draining' } });

  gate.releaseAll();
  expect((await open).choices[0]!.message.content).toBe('finished during the drain');
  // The endless stream outlives the drain time: it is cut, and the provider sees it go.
  await expect(endless.next()).rejects.toThrow();
  await drained;
  expect(s.provider.inFlight).toBe(0);
  expect(s.provider.requests.map((r) => r.aborted)).toEqual([true, false]);
}, 240_000);
