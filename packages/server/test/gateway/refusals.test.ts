import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { expect, it } from 'vitest';
import { createConcurrencyLimiter, type ConcurrencyLimiter } from 'sluice';
import { ManualClock } from 'sluice/concurrency';
import { until } from '../harness/index.js';
import { heldReplies, rawRequest, startGatewayServer } from './harness.js';

// Item 4: refusals a caller's SDK understands (429 with Retry-After in its API's shape, 503 for
// a limiter that fails), the tenant's cap, quota and spend, and 413 before the body is read.

const chat = (client: OpenAI, content = 'q') =>
  client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content }] });
const message = (client: Anthropic) =>
  client.messages.create({ model: 'c', max_tokens: 5, messages: [{ role: 'user', content: 'q' }] });
const caught = <T>(p: Promise<T>) =>
  p.then(
    () => undefined,
    (e: unknown) => e as Error & { status: number; error: unknown; headers: Headers },
  );

it('a wait past maxWaitMs and a full queue are 429 with Retry-After: RateLimitError in both SDKs', async () => {
  const clock = new ManualClock();
  const gate = heldReplies();
  const limiter = createConcurrencyLimiter({
    name: 'tight',
    maxConcurrent: 1,
    maxQueued: 2,
    clock,
    workloads: { default: { maxWaitMs: 2_000 } },
  });
  const s = await startGatewayServer({ limiter, standIn: { reply: gate.reply } });
  const token = await s.token({ tenant: 'acme' });
  const first = chat(s.openai(token));
  await until(() => gate.held.length === 1, 'the first call holds the slot');

  const waiting = caught(chat(s.openai(token)));
  const waitingClaude = caught(message(s.anthropic(token)));
  await until(() => limiter.stats().queued === 2, 'two calls wait');
  // The queue holds 2: a third is refused at once.
  const full = await caught(chat(s.openai(token)));
  expect(full).toBeInstanceOf(OpenAI.RateLimitError);
  expect(full!.headers.get('retry-after')).toBe('1');
  expect(full!.error).toMatchObject({
    type: 'rate_limit_exceeded',
    code: 'rate_limit_exceeded',
    param: null,
  });

  clock.advance(2_000);
  const timedOut = await waiting;
  expect(timedOut).toBeInstanceOf(OpenAI.RateLimitError);
  expect(timedOut!.headers.get('retry-after')).toBe('2');
  const timedOutClaude = await waitingClaude;
  expect(timedOutClaude).toBeInstanceOf(Anthropic.RateLimitError);
  expect(timedOutClaude!.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error' } });
  expect(timedOutClaude!.headers.get('retry-after')).toBe('2');

  gate.releaseAll();
  await first;
  expect(s.provider.requests).toHaveLength(1);
}, 240_000);

it('a limiter that fails is 503 in both shapes, and nothing reaches the provider', async () => {
  const inner: ConcurrencyLimiter<string> = createConcurrencyLimiter({ name: 'broken', maxConcurrent: 2 });
  const broken: ConcurrencyLimiter<string> = {
    name: 'broken',
    acquire: () => Promise.reject(new Error('connection to the limiter database lost')),
    renew: (lease) => inner.renew(lease),
    release: (lease) => inner.release(lease),
  };
  const s = await startGatewayServer({ limiter: broken });
  const token = await s.token({ tenant: 'acme' });
  const openaiError = await caught(chat(s.openai(token)));
  expect(openaiError).toBeInstanceOf(OpenAI.InternalServerError);
  expect(openaiError!.status).toBe(503);
  expect(openaiError!.error).toMatchObject({ type: 'limiter_unavailable' });
  const claudeError = await caught(message(s.anthropic(token)));
  expect(claudeError).toBeInstanceOf(Anthropic.InternalServerError);
  expect(claudeError!.status).toBe(503);
  expect(claudeError!.error).toMatchObject({ type: 'error', error: { type: 'api_error' } });
  expect(s.provider.requests).toHaveLength(0);
}, 240_000);

it("the tenant's cap bounds its gateway requests in flight; another tenant is not held back", async () => {
  const gate = heldReplies();
  const s = await startGatewayServer({
    tenants: { small: { maxConcurrentAgentRuns: 1 } },
    standIn: { reply: gate.reply },
  });
  const small = await s.token({ tenant: 'small' });
  const first = chat(s.openai(small));
  await until(() => gate.held.length === 1, 'the first call is in flight');
  const second = await caught(chat(s.openai(small)));
  expect(second).toBeInstanceOf(OpenAI.RateLimitError);
  expect(second!.message).toContain('the limit is 1');
  const other = chat(s.openai(await s.token({ tenant: 'other' })));
  await until(() => gate.held.length === 2, "another tenant's call goes through");
  gate.releaseAll();
  await Promise.all([first, other]);
  // The place was given back: the tenant may call again.
  expect((await chat(s.openai(small))).choices).toHaveLength(1);
}, 240_000);

it('the run quota counts gateway requests beside runs', async () => {
  const s = await startGatewayServer({ tenants: { q: { runs: { limit: 3, per: 'day' } } } });
  const q = await s.token({ tenant: 'q' });
  expect((await s.call('POST', '/agents/echo/runs', { input: 'one run' }, q)).status).toBe(200);
  await chat(s.openai(q));
  await chat(s.openai(q));
  // The gateway's rows are written after each answer: wait until both are there.
  await until(async () => {
    const { rows } = await s.server.store.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM gateway_usage WHERE tenant = 'q'",
    );
    return rows[0]!.n === 2;
  }, 'both requests are counted');
  const refused = await caught(chat(s.openai(q)));
  expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
  expect(refused!.error).toMatchObject({ type: 'agent_quota_exceeded' });
  expect(s.provider.requests).toHaveLength(3);
}, 240_000);

it('usage through a priced gateway is counted into spend: past the limit, gateway calls and runs are refused', async () => {
  // $1 per million tokens each way; each call reports 11 + 7 tokens: $0.000018.
  const s = await startGatewayServer({
    tenants: { spender: { spend: { limitUsd: 0.00003, per: 'day' } } },
    gateway: { cost: { input: 1, output: 1 } },
  });
  const token = await s.token({ tenant: 'spender' });
  await chat(s.openai(token));
  await until(async () => {
    const { rows } = await s.server.store.db.query<{ cost: number }>(
      "SELECT cost FROM gateway_usage WHERE tenant = 'spender'",
    );
    return rows.length === 1 && Math.abs(rows[0]!.cost - 0.000018) < 1e-12;
  }, 'the first call is priced');
  await chat(s.openai(token));
  await until(async () => {
    const { rows } = await s.server.store.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM gateway_usage WHERE tenant = 'spender'",
    );
    return rows[0]!.n === 2;
  }, 'the second call is priced');
  const refused = await caught(chat(s.openai(token)));
  expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
  expect(refused!.error).toMatchObject({ type: 'spend_limit_exceeded' });
  expect(refused!.headers.get('x-should-retry')).toBe('false');
  const run = await s.call('POST', '/agents/echo/runs', { input: 'a run' }, token);
  expect(run.status).toBe(429);
  expect(run.body.error.type).toBe('spend_limit_exceeded');
  expect(run.body.error.spent_usd).toBeCloseTo(0.000036, 12);
}, 240_000);

it('413 from a declared Content-Length over 10 MB, before the body is read, in each shape', async () => {
  const s = await startGatewayServer();
  const token = await s.token({ tenant: 'acme' });
  for (const [path, auth, shape] of [
    [
      '/api/client/v1/gateway/openai/chat/completions',
      { authorization: `Bearer ${token}` },
      { error: { type: 'request_too_large' } },
    ],
    [
      '/api/client/v1/gateway/claude/v1/messages',
      { 'x-api-key': token },
      { type: 'error', error: { type: 'request_too_large' } },
    ],
  ] as const) {
    // The headers promise 11 MB and no byte of it is sent: an answer proves nothing was waited for.
    const answer = await rawRequest(s.server.url, {
      method: 'POST',
      path,
      headers: { ...auth, 'content-type': 'application/json', 'content-length': String(11 * 1024 * 1024) },
      hold: true,
    });
    expect(answer.status).toBe(413);
    expect(JSON.parse(answer.body)).toMatchObject(shape);
  }
  expect(s.provider.requests).toHaveLength(0);
}, 240_000);
