// What a run tells its limiter about provider capacity: the estimate at acquire, the usage and
// the provider's status and rate-limit headers at release, against the stand-in as an account.
import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  createAgent,
  type AcquireRequest,
  type ConcurrencyLease,
  type ConcurrencyLimiter,
  type ReleaseDetails,
} from 'sluice';
import { replies } from '@sluice/testkit';
import { estimateInputTokens } from '../../src/agent/token-estimate.js';
import { eventLog, until, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

/**
 * A limiter of its own, as any application may write: it keeps what it was asked and told,
 * and leaves the allocation to the in-memory limiter it wraps.
 */
class RecordingLimiter implements ConcurrencyLimiter<string> {
  readonly acquired: (AcquireRequest<string> | undefined)[] = [];
  readonly released: (ReleaseDetails | undefined)[] = [];
  readonly name: string;

  constructor(readonly inner: ConcurrencyLimiter<string>) {
    this.name = inner.name;
  }

  acquire(request?: AcquireRequest<string>): Promise<ConcurrencyLease<string>> {
    this.acquired.push(request);
    return this.inner.acquire(request);
  }

  renew(lease: ConcurrencyLease<string>) {
    return this.inner.renew(lease);
  }

  release(lease: ConcurrencyLease<string>, details?: ReleaseDetails): Promise<void> {
    this.released.push(details);
    return this.inner.release(lease, details);
  }

  stats() {
    return this.inner.stats!();
  }
}

const at = 0;
/** What the agent's first request sends, as pi-ai's context. */
const firstRequest = (prompt: string) => ({
  systemPrompt: 'Be brief.',
  messages: [{ role: 'user' as const, content: prompt, timestamp: at }],
});

describe('the estimate reaches the limiter, and the usage settles', () => {
  it("acquires with the request's estimated input and its output cap, and releases with the response's usage and headers", async () => {
    const p = await f.provider({
      reply: () => ({ text: 'short answer', usage: { input: 42, output: 9 } }),
      limits: { requestsPerMinute: 100, tokensPerMinute: 100_000 },
      clock: f.clock,
    });
    const limiter = f.watch(new RecordingLimiter(f.limiter()));
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'Be brief.',
      concurrency: { limiter },
      clock: f.clock,
    });
    const prompt = 'How many tokens will this question take?';
    await agent.run({ prompt });

    expect(limiter.acquired).toHaveLength(1);
    expect(limiter.acquired[0]?.tokens).toEqual({
      input: estimateInputTokens(firstRequest(prompt)),
      output: 4096, // the stand-in model's output cap, which pi-ai sends
    });
    expect(limiter.released).toHaveLength(1);
    const released = limiter.released[0]!;
    expect(released.usage).toEqual({ input: 42, output: 9 });
    expect(released.provider?.status).toBe(200);
    expect(released.provider?.retryAfterMs).toBeUndefined();
    // The account's headers as the stand-in sent them: 1 request of 100 taken (back in 600 ms),
    // and the prompt plus the 4096-token cap charged.
    expect(released.provider?.limits?.requests).toEqual({ limit: 100, remaining: 99, resetMs: 600 });
    const tokens = released.provider?.limits?.tokens;
    expect(tokens?.limit).toBe(100_000);
    const charged = 100_000 - tokens!.remaining!;
    expect(charged).toBeGreaterThan(4096);
    expect(tokens?.resetMs).toBe(Math.ceil((charged * 60_000) / 100_000));
  });

  it("settles a token budget to the response's usage: the estimate is charged while the request runs", async () => {
    const gate: (() => void)[] = [];
    const p = await f.provider({
      reply: () =>
        new Promise((resolve) => gate.push(() => resolve({ text: 'ok', usage: { input: 42, output: 9 } }))),
    });
    const limiter = f.limiter({ rate: { tokensPerMinute: 100_000 } });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'Be brief.',
      concurrency: { limiter },
      clock: f.clock,
    });
    const prompt = 'Settle me.';
    const run = agent.run({ prompt });
    await until(() => gate.length === 1, { message: 'the request reaches the stand-in' });
    const estimate = estimateInputTokens(firstRequest(prompt)) + 4096;
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 100_000 - estimate, capacity: 100_000 });
    gate[0]!();
    await run;
    // No time passed on the clock: what is missing is exactly what the response reported.
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 100_000 - 51, capacity: 100_000 });
  });

  it('charges concurrency.outputTokens instead of the cap, the run over the agent', async () => {
    const p = await f.provider();
    const limiter = f.watch(new RecordingLimiter(f.limiter()));
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter, outputTokens: 300 },
      clock: f.clock,
    });
    await agent.run({ prompt: 'a' });
    await agent.run({ prompt: 'b', concurrency: { outputTokens: 20 } });
    expect(limiter.acquired.map((r) => r?.tokens?.output)).toEqual([300, 20]);
  });

  it('reads the Anthropic rate-limit headers of an Anthropic response', async () => {
    const p = await f.provider({ limits: { requestsPerMinute: 10 }, clock: f.clock });
    const limiter = f.watch(new RecordingLimiter(f.limiter()));
    const agent = createAgent({
      model: f.model(p, 'anthropic-messages'),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
    });
    await agent.run({ prompt: 'hi' });
    // The reset came as an RFC 3339 time, read against the same clock.
    expect(limiter.released[0]?.provider?.limits).toEqual({
      requests: { limit: 10, remaining: 9, resetMs: 6_000 },
    });
  });

  it('refuses an outputTokens that is not a whole number from 0, before anything is sent', async () => {
    const p = await f.provider();
    const limiter = f.limiter();
    expect(() =>
      createAgent({
        model: f.model(p),
        credentials: f.credentials,
        concurrency: { limiter, outputTokens: -1 },
      }),
    ).toThrow(ConcurrencyConfigError);
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, concurrency: { limiter } });
    for (const outputTokens of [1.5, Number.NaN, '100' as never]) {
      const error = await agent.run({ prompt: 'x', concurrency: { outputTokens } }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ConcurrencyConfigError);
      expect(error).toMatchObject({ field: 'concurrency.outputTokens', value: outputTokens });
      expect((error as Error).message).toContain('`concurrency.outputTokens`');
    }
    expect(p.requests).toHaveLength(0);
  });
});

describe("the provider's 429 reaches the limiter", () => {
  it('releases the refused attempt with status 429 and retryAfterMs, emits provider-throttled, and retries on a new slot', async () => {
    // The account's tokens, which the limiter is not told of: the first answer spends 4,010 of
    // 6,000, so the next request (its prompt and the 4,096-token cap) does not fit.
    const p = await f.provider({
      reply: replies({ text: 'a long answer', usage: { input: 10, output: 4_000 } }, { text: 'ok' }),
      limits: { tokensPerMinute: 6_000 },
      clock: f.clock,
    });
    const limiter = f.watch(new RecordingLimiter(f.limiter()));
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
      events: { onConcurrency: log.onConcurrency },
    });
    await agent.run({ prompt: 'first' });
    const second = agent.run({ prompt: 'second' });
    await until(() => limiter.released.length === 2, { message: 'the refused attempt is released' });
    expect(p.rateLimited).toBe(1);
    const refused = limiter.released[1]!;
    expect(refused.usage).toBeUndefined(); // nothing used: the estimate stays as it was
    const { status, retryAfterMs, limits } = refused.provider!;
    expect(status).toBe(429);
    // 1,990 tokens were left; the request needs its prompt (under 100 tokens as the stand-in
    // counts it) and the 4,096 cap, each missing token back in 10 ms at 6,000 a minute.
    expect(limits?.tokens).toMatchObject({ limit: 6_000, remaining: 1_990 });
    expect(retryAfterMs! % 10).toBe(0);
    expect(retryAfterMs).toBeGreaterThan((4_096 - 1_990) * 10);
    expect(retryAfterMs).toBeLessThan((4_096 + 100 - 1_990) * 10);
    expect(limits?.retryAfterMs).toBe(retryAfterMs);
    expect(log.of('provider-throttled')).toMatchObject([{ status: 429, retryAfterMs }]);

    // Our policy waits what the provider named, on the run's clock; then the tokens are back.
    const wait = await f.clock.timer((t) => t.ms === retryAfterMs);
    f.clock.advance(wait.ms);
    await expect(second).resolves.toMatchObject({ status: 'completed', text: 'ok' });
    // The SDK did not retry the 429 itself: three requests reached the account, one per slot.
    expect(p.requests.map((r) => r.status)).toEqual([200, 429, 200]);
    expect(limiter.acquired).toHaveLength(3);
    expect(p.rateLimited).toBe(1);
  });
});

describe('a connection dropped before the response', () => {
  it('is retried by the SDK inside the same slot: one acquire, two HTTP attempts', async () => {
    const p = await f.provider({ reply: replies({ drop: 'before-response' }, { text: 'second try' }) });
    const limiter = f.watch(new RecordingLimiter(f.limiter()));
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
      events: { onConcurrency: log.onConcurrency },
    });
    const result = await agent.run({ prompt: 'hi' });
    expect(result.text).toBe('second try');
    expect(p.requests).toHaveLength(2);
    expect(p.requests[0]).toMatchObject({ aborted: true, done: false });
    expect(limiter.acquired).toHaveLength(1);
    expect(limiter.released).toHaveLength(1);
    expect(log.types()).toEqual(['wait-started', 'acquired', 'released']);
    // One request of the run; the SDK's retry of a connection is not a new one.
    expect(result.usage.requests).toBe(1);
    await until(() => p.inFlight === 0);
  });
});
