/**
 * Budgets an adaptive limiter learns from the provider's rate-limit headers (learned.ts), on a
 * ManualClock: a stated figure becomes a bucket, a lower one lowers it, a configured figure
 * wins, a request larger than a learned figure goes once the bucket is full, and hostile or
 * broken headers (garbage, NaN, negative, huge, a remaining above the limit, a per-day window,
 * another account's figures) neither throw nor wedge the limiter.
 */
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ManualClock,
  createConcurrencyLimiter,
  rateLimitsFromHeaders,
  type ConcurrencyLimiterOptions,
  type ProviderRateLimits,
} from 'sluice/concurrency';

function track<T>(promise: Promise<T>) {
  const state: { settled: boolean; value?: T; error?: unknown } = { settled: false };
  promise.then(
    (value) => Object.assign(state, { settled: true, value }),
    (error: unknown) => Object.assign(state, { settled: true, error }),
  );
  return state;
}

function setup(options: Partial<ConcurrencyLimiterOptions> = {}) {
  const clock = new ManualClock();
  const limiter = createConcurrencyLimiter({ maxConcurrent: 8, adaptive: true, clock, ...options });
  /** One request answered 200 with these rate-limit figures (and its usage, if given). */
  const answer = async (limits: ProviderRateLimits, usage?: { input: number; output: number }) => {
    const lease = await limiter.acquire({ tokens: usage ?? { input: 0 } });
    await limiter.release(lease, { ...(usage && { usage }), provider: { status: 200, limits } });
  };
  return { clock, limiter, answer };
}

/** OpenAI's headers of an account of 6,000 tokens and 60 requests a minute. */
const openAiHeaders = (tokensRemaining: number, tokensLimit = 6_000) => ({
  'x-ratelimit-limit-tokens': String(tokensLimit),
  'x-ratelimit-remaining-tokens': String(tokensRemaining),
  'x-ratelimit-reset-tokens': '40s',
  'x-ratelimit-limit-requests': '60',
  'x-ratelimit-remaining-requests': '59',
  'x-ratelimit-reset-requests': '1s',
});

describe('learning budgets from the headers', () => {
  it("a response's headers create the buckets, and the next grant waits for the refill", async () => {
    const { clock, limiter, answer } = setup();
    expect(limiter.stats().budgets).toBeUndefined();
    await answer(rateLimitsFromHeaders(openAiHeaders(2_000), clock.now()));
    expect(limiter.stats().budgets).toEqual({
      requests: { available: 59, capacity: 60 },
      tokens: { available: 2_000, capacity: 6_000 },
    });
    const first = await limiter.acquire({ tokens: { input: 1_500, output: 500 } });
    // 6,000 a minute is 100 a second: 1,000 more tokens take 10 s.
    const second = track(limiter.acquire({ tokens: { input: 1_000 } }));
    clock.advance(9_999);
    await flush();
    expect(second.settled).toBe(false);
    clock.advance(1);
    await flush();
    expect(second.settled).toBe(true);
    expect(second.error).toBeUndefined();
    await limiter.release(first);
    await limiter.release(second.value!);
  });

  it('without adaptive, the headers set no budget (the limiter counts slots as configured)', async () => {
    const { limiter, answer } = setup({ adaptive: false });
    await answer({ tokens: { limit: 6_000, remaining: 10, resetMs: 1_000 } });
    expect(limiter.stats().budgets).toBeUndefined();
    await Promise.all(Array.from({ length: 8 }, () => limiter.acquire({ tokens: { input: 5_000 } })));
    expect(limiter.stats().active).toBe(8);
  });

  it('a later header with a lower limit lowers the bucket at once; a higher one adds no tokens', async () => {
    const { limiter, answer } = setup();
    await answer({ tokens: { limit: 6_000, remaining: 6_000 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 6_000, capacity: 6_000 });
    await answer({ tokens: { limit: 3_000 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 3_000, capacity: 3_000 });
    await expect(limiter.acquire({ tokens: { input: 3_000 } })).resolves.toBeDefined();
    expect(limiter.stats().budgets?.tokens?.available).toBe(0);
    await answer({ tokens: { limit: 12_000 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 0, capacity: 12_000 });
  });

  it('a configured figure wins over a learned one; the budgets it leaves are learned', async () => {
    const { limiter, answer } = setup({ rate: { tokensPerMinute: 1_000 } });
    await answer({
      tokens: { limit: 6_000, remaining: 5_000 },
      requests: { limit: 60, remaining: 50 },
    });
    expect(limiter.stats().budgets).toEqual({
      // The provider's remaining still lowers the configured bucket; its figure does not replace it.
      tokens: { available: 1_000, capacity: 1_000 },
      requests: { available: 50, capacity: 60 },
    });
    // Larger than the configured budget: refused at once, as before.
    await expect(limiter.acquire({ tokens: { input: 1_001 } })).rejects.toMatchObject({
      name: 'ConcurrencyConfigError',
      field: 'tokens',
    });
  });

  it('a request larger than a learned figure is not refused: it goes once the bucket is full', async () => {
    const { clock, limiter, answer } = setup();
    await answer({ tokens: { limit: 6_000, remaining: 3_000 } });
    const big = track(limiter.acquire({ tokens: { input: 8_000 } }));
    // 3,000 short of full at 100 a second.
    clock.advance(29_999);
    await flush();
    expect(big.settled).toBe(false);
    clock.advance(1);
    await flush();
    expect(big.error).toBeUndefined();
    expect(big.settled).toBe(true);
    // It took its whole estimate: the bucket is in debt, and the next request waits it out.
    expect(limiter.stats().budgets?.tokens?.available).toBe(0);
    const next = track(limiter.acquire({ tokens: { input: 100 } }));
    clock.advance(20_000);
    await flush();
    expect(next.settled).toBe(false);
    clock.advance(1_000);
    await flush();
    expect(next.settled).toBe(true);
  });

  it('a grant made before the budget was known is settled into it: the remaining counted its estimate', async () => {
    const { limiter } = setup();
    const early = await limiter.acquire({ tokens: { input: 1_000, output: 500 } });
    const other = await limiter.acquire();
    // The provider had admitted `early` at its estimate when it wrote this remaining.
    await limiter.release(other, {
      provider: { status: 200, limits: { tokens: { limit: 6_000, remaining: 4_000 } } },
    });
    expect(limiter.stats().budgets?.tokens?.available).toBe(4_000);
    // Its end gives back what it did not use, as the provider's own count does.
    await limiter.release(early, { usage: { input: 90, output: 10 }, provider: { status: 200 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(5_400);
    const late = await limiter.acquire({ tokens: { input: 1_000, output: 500 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(3_900);
    // A later answer saying less is the truth (other clients, or a refund it never made).
    await limiter.release(late, {
      usage: { input: 90, output: 10 },
      provider: { status: 200, limits: { tokens: { limit: 6_000, remaining: 3_000 } } },
    });
    expect(limiter.stats().budgets?.tokens?.available).toBe(3_000);
  });

  it('a stated remaining of 0 pauses the limiter and the bucket waits for its refill', async () => {
    const { clock, limiter, answer } = setup();
    await answer({ tokens: { limit: 6_000, remaining: 0, resetMs: 60_000 } });
    const waiting = track(limiter.acquire({ tokens: { input: 600 } }));
    clock.advance(59_999);
    await flush();
    expect(waiting.settled).toBe(false);
    clock.advance(1);
    await flush();
    expect(waiting.settled).toBe(true);
  });
});

describe('hostile and broken headers', () => {
  it('garbage, NaN, negative, zero and huge figures are ignored, and never throw', async () => {
    const { clock, limiter, answer } = setup();
    const garbage: Record<string, string>[] = [
      { 'x-ratelimit-limit-tokens': 'NaN', 'x-ratelimit-remaining-tokens': 'lots' },
      { 'x-ratelimit-limit-tokens': '-60000', 'x-ratelimit-limit-requests': '0' },
      { 'x-ratelimit-limit-tokens': '1e400', 'x-ratelimit-limit-requests': 'Infinity' },
      { 'x-ratelimit-limit-tokens': '99999999999999999999', 'x-ratelimit-reset-tokens': 'soon' },
      { 'anthropic-ratelimit-tokens-limit': '0x10', 'anthropic-ratelimit-tokens-reset': 'tomorrow' },
      { 'x-ratelimit-limit-tokens': '60000 tokens', 'x-ratelimit-limit-requests': '1.5e' },
    ];
    for (const headers of garbage) await answer(rateLimitsFromHeaders(headers, clock.now()));
    // And figures no header parser would give, passed by a caller of release directly.
    const direct: unknown[] = [
      { tokens: { limit: Number.NaN } },
      { tokens: { limit: -1 }, requests: { limit: 0.5 } },
      { tokens: { limit: Infinity }, inputTokens: { limit: 1e300 } },
      { tokens: { limit: '60000' }, outputTokens: 'x', requests: null },
      // A body parsed from JSON: `__proto__` is an own key there, not a window.
      JSON.parse('{"__proto__": {"tokens": {"limit": 10}}}'),
      'nonsense',
    ];
    for (const limits of direct) await answer(limits as ProviderRateLimits);
    expect(limiter.stats().budgets).toBeUndefined();
    await Promise.all(Array.from({ length: 8 }, () => limiter.acquire({ tokens: { input: 1e9 } })));
    expect(limiter.stats().active).toBe(8);
  });

  it('a remaining above the limit leaves the bucket at its figure', async () => {
    const { limiter, answer } = setup();
    await answer({ tokens: { limit: 6_000, remaining: 9e15 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 6_000, capacity: 6_000 });
  });

  it("a window that resets in more than a minute (OpenAI's requests per day) is not a per-minute budget", async () => {
    const { clock, limiter, answer } = setup();
    await answer(
      rateLimitsFromHeaders(
        {
          'x-ratelimit-limit-requests': '200',
          'x-ratelimit-remaining-requests': '150',
          'x-ratelimit-reset-requests': '6m0s',
          'x-ratelimit-limit-tokens': '40000',
          'x-ratelimit-remaining-tokens': '40000',
          'x-ratelimit-reset-tokens': '0s',
        },
        clock.now(),
      ),
    );
    expect(limiter.stats().budgets).toEqual({ tokens: { available: 40_000, capacity: 40_000 } });
  });

  it("another account's headers halving the figure lower it at once; alternating ones never raise the level", async () => {
    const { clock, limiter, answer } = setup();
    await answer({ tokens: { limit: 60_000, remaining: 60_000 } });
    // Another key of the same limiter: half the figure, half used.
    await answer({ tokens: { limit: 30_000, remaining: 15_000 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 15_000, capacity: 30_000 });
    // The first account answers again: its figure returns, the level does not jump back.
    await answer({ tokens: { limit: 60_000, remaining: 59_000 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 15_000, capacity: 60_000 });
    // Flip-flopping for a while: the bucket is never above the figure of the moment, and
    // grants go on (the limiter is not wedged).
    for (let i = 0; i < 20; i++) {
      clock.advance(500);
      const figure = i % 2 === 0 ? 30_000 : 60_000;
      await answer({ tokens: { limit: figure, remaining: figure - 1_000 } }, { input: 500, output: 100 });
      const tokens = limiter.stats().budgets!.tokens!;
      expect(tokens.capacity).toBe(figure);
      expect(tokens.available).toBeLessThanOrEqual(Math.min(figure - 1_000, 30_000));
    }
    await expect(limiter.acquire({ tokens: { input: 1_000 } })).resolves.toBeDefined();
  });
});
