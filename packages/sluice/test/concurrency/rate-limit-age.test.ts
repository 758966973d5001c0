// A provider's rate-limit figures are read at the response's start and reported at its end:
// what `agedRateLimits` makes of them, and why the limiter needs it.
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ManualClock,
  agedRateLimits,
  createConcurrencyLimiter,
  rateLimitsFromHeaders,
} from 'sluice/concurrency';

/** OpenAI's headers of an answer that took the last tokens of the minute (back in 30 s). */
const exhausted = new Headers({
  'x-ratelimit-limit-tokens': '60000',
  'x-ratelimit-remaining-tokens': '0',
  'x-ratelimit-reset-tokens': '30s',
});

describe('figures read at the start of a long answer', () => {
  it('a window that reset while the answer streamed neither pauses the limiter nor empties its bucket', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 4, rate: { tokensPerMinute: 60_000 }, clock });
    const lease = await limiter.acquire({ tokens: { input: 1000 } });
    const limits = rateLimitsFromHeaders(exhausted, clock.now());
    clock.advance(45_000); // the stream ends 45 s after its headers came
    await limiter.release(lease, {
      usage: { input: 1000 },
      provider: { status: 200, limits: agedRateLimits(limits, 45_000) },
    });
    const next = limiter.acquire({ tokens: { input: 1000 } });
    let granted = false;
    void next.then(() => (granted = true));
    await flush();
    expect(granted).toBe(true);
    // Full again after 45 s of refill, less the new grant.
    expect(limiter.stats().budgets?.tokens?.available).toBe(59_000);
    await limiter.release(await next);
  });

  it('the same figures as read pause every grant for 30 s more, counted from the end of the stream', async () => {
    // What the limiter did before the figures were aged: the contrast the test above rests on.
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 4, rate: { tokensPerMinute: 60_000 }, clock });
    const lease = await limiter.acquire({ tokens: { input: 1000 } });
    const limits = rateLimitsFromHeaders(exhausted, clock.now());
    clock.advance(45_000);
    await limiter.release(lease, { usage: { input: 1000 }, provider: { status: 200, limits } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(0);
    const next = limiter.acquire({});
    let granted = false;
    void next.then(() => (granted = true));
    clock.advance(29_999);
    await flush();
    expect(granted).toBe(false);
    clock.advance(1);
    await flush();
    expect(granted).toBe(true);
    await limiter.release(await next);
  });
});

describe('agedRateLimits', () => {
  const read = {
    requests: { limit: 500, remaining: 499, resetMs: 120 },
    tokens: { limit: 60_000, remaining: 12, resetMs: 50_000 },
    inputTokens: { remaining: 7 },
    outputTokens: { remaining: 0, resetMs: 1_000 },
    retryAfterMs: 5_000,
  };

  it('shortens running resets and the retry-after by the time gone, and keeps only the limit of a window that reset', () => {
    expect(agedRateLimits(read, 2_000)).toEqual({
      requests: { limit: 500 },
      tokens: { limit: 60_000, remaining: 12, resetMs: 48_000 },
      inputTokens: { remaining: 7 }, // no reset given: nothing says the window is over
      retryAfterMs: 3_000,
    });
    expect(agedRateLimits(read, 9_000).retryAfterMs).toBe(0);
  });

  it('returns the figures as they are for no time gone, a clock that stepped back, or garbage', () => {
    for (const elapsed of [0, -5_000, Number.NaN, Infinity]) expect(agedRateLimits(read, elapsed)).toBe(read);
  });
});
