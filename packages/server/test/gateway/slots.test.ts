import { expect, it } from 'vitest';
import { createConcurrencyLimiter } from 'sluice';
import { ManualClock } from 'sluice/concurrency';
import { until } from '../harness/index.js';
import { heldReplies, startGatewayServer } from './harness.js';

// Item 2: every forwarded POST holds a slot of the gateway's limiter until its response has
// ended, so the provider never sees more requests at once than the limiter allows, whoever
// sends them.

it('20 concurrent calls through a limiter of 3 reach the provider at most 3 at a time', async () => {
  const gate = heldReplies();
  const limiter = createConcurrencyLimiter({ name: 'three', maxConcurrent: 3 });
  const s = await startGatewayServer({ limiter, standIn: { reply: gate.reply } });
  const client = s.openai(await s.token({ tenant: 'acme' }));
  const calls = Array.from({ length: 20 }, (_, i) =>
    client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `call ${i}` }] }),
  );
  await until(() => gate.held.length === 3, 'three requests reach the provider');
  expect(s.provider.inFlight).toBe(3);
  await until(async () => (await limiter.stats()).queued === 17, 'the other 17 wait for a slot');
  expect(limiter.stats()).toMatchObject({ active: 3, queued: 17 });
  gate.releaseAll();
  const answers = await Promise.all(calls);
  expect(answers.every((a) => a.choices[0]!.message.content === 'held answer')).toBe(true);
  expect(s.provider.requests).toHaveLength(20);
  expect(s.provider.peakInFlight).toBe(3);
  expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
}, 240_000);

it('a Sluice agent and gateway callers on one limiter together never exceed it', async () => {
  const gate = heldReplies();
  const limiter = createConcurrencyLimiter({ name: 'shared', maxConcurrent: 2 });
  const s = await startGatewayServer({ limiter, standIn: { reply: gate.reply } });
  const token = await s.token({ tenant: 'acme' });
  const run = await s.call('POST', '/agents/echo/runs', { input: 'agent work', wait: false }, token);
  expect(run.status).toBe(202);
  await until(() => gate.held.length === 1, "the agent's request reaches the provider");
  const openai = s.openai(token);
  const anthropic = s.anthropic(token);
  const calls = [
    openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'a' }] }),
    anthropic.messages.create({ model: 'c', max_tokens: 10, messages: [{ role: 'user', content: 'b' }] }),
    openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'c' }] }),
  ];
  await until(() => gate.held.length === 2, 'one gateway call takes the second slot');
  await until(() => limiter.stats().queued === 2, 'the other two gateway calls wait');
  expect(s.provider.inFlight).toBe(2);
  gate.releaseAll();
  await Promise.all(calls);
  const ended = async () =>
    (await s.call('GET', `/agents/runs/${run.body.id}`, undefined, token)).body.status;
  await until(async () => (await ended()) === 'succeeded', 'the run ends');
  expect(s.provider.requests).toHaveLength(4);
  expect(s.provider.peakInFlight).toBe(2);
}, 240_000);

it("the slot is held with the estimate and released with the response's usage: the token budget is settled to it", async () => {
  const gate = heldReplies({ text: 'ok', usage: { input: 11, output: 7 } });
  // A clock that stands still: the bucket does not refill between two readings.
  const limiter = createConcurrencyLimiter({
    name: 'budgeted',
    maxConcurrent: 4,
    rate: { tokensPerMinute: 100_000 },
    clock: new ManualClock(),
  });
  const s = await startGatewayServer({ limiter, standIn: { reply: gate.reply } });
  const client = s.openai(await s.token({ tenant: 'acme' }));
  const available = () => limiter.stats().budgets!.tokens!.available;
  const call = client.chat.completions.create({
    model: 'm',
    max_tokens: 5_000,
    messages: [{ role: 'user', content: 'x'.repeat(400) }],
  });
  await until(() => gate.held.length === 1, 'the request reaches the provider');
  // Held: the estimate is charged, 5,000 output tokens and about 100 of input.
  const charged = 100_000 - available();
  expect(charged).toBeGreaterThanOrEqual(5_100);
  expect(charged).toBeLessThan(5_200);
  gate.releaseAll();
  await call;
  await until(() => limiter.stats().active === 0, 'the slot is released');
  // Settled to the usage the response reported: 11 + 7.
  expect(100_000 - available()).toBe(18);
}, 240_000);
