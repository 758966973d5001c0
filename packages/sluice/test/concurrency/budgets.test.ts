/**
 * Budgets, settling and the provider's pause on the in-memory limiter, driven by a
 * ManualClock: every wait ends at the exact millisecond the bucket arithmetic says.
 */
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  ConcurrencyTimeoutError,
  ManualClock,
  createConcurrencyLimiter,
  type ConcurrencyEvent,
} from 'sluice/concurrency';

function track<T>(promise: Promise<T>) {
  const state: { settled: boolean; value?: T; error?: unknown } = { settled: false };
  promise.then(
    (value) => Object.assign(state, { settled: true, value }),
    (error: unknown) => Object.assign(state, { settled: true, error }),
  );
  return state;
}

async function advance(clock: ManualClock, ms: number): Promise<void> {
  clock.advance(ms);
  await flush();
}

describe('budgets as token buckets', () => {
  it('a request budget starts full, then refills at figure / 60 per second', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 100, rate: { requestsPerMinute: 60 }, clock });
    for (let i = 0; i < 60; i++) await limiter.release(await limiter.acquire());
    expect(limiter.stats().budgets).toEqual({ requests: { available: 0, capacity: 60 } });
    const timers = clock.pendingTimers;
    const next = track(limiter.acquire());
    await flush();
    expect(next.settled).toBe(false);
    // One wake timer, set to the refill of one request: 1 s.
    expect(clock.pendingTimers).toBe(timers + 1);
    await advance(clock, 999);
    expect(next.settled).toBe(false);
    await advance(clock, 1);
    expect(next.value?.acquiredAt).toBe(clock.now());
    await limiter.release(next.value!);
    expect(clock.pendingTimers).toBe(timers);
    // It never holds more than its figure, however long it is left alone.
    await advance(clock, 10 * 60_000);
    expect(limiter.stats().budgets).toEqual({ requests: { available: 60, capacity: 60 } });
  });

  it('a grant takes input + output from tokensPerMinute, each part from its own budget', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 10,
      rate: { tokensPerMinute: 6000, inputTokensPerMinute: 4800, outputTokensPerMinute: 1200 },
      clock,
    });
    const a = await limiter.acquire({ tokens: { input: 3000, output: 1000 } });
    expect(limiter.stats().budgets).toEqual({
      tokens: { available: 2000, capacity: 6000 },
      inputTokens: { available: 1800, capacity: 4800 },
      outputTokens: { available: 200, capacity: 1200 },
    });
    // Fits `tokens` (2000) and `inputTokens`, not `outputTokens` (200 left, refilling 20 a second).
    const b = track(limiter.acquire({ tokens: { input: 100, output: 300 } }));
    await advance(clock, 4999);
    expect(b.settled).toBe(false);
    await advance(clock, 1);
    expect(b.value).toBeDefined();
    // No `tokens`: 0 tokens, whatever is left.
    const c = await limiter.acquire();
    for (const lease of [a, b.value!, c]) await limiter.release(lease);
  });

  it('refuses at once a request larger than a whole budget, naming the budget, figure and value', async () => {
    const limiter = createConcurrencyLimiter({
      name: 'openai',
      maxConcurrent: 2,
      rate: { tokensPerMinute: 10_000, outputTokensPerMinute: 2_000 },
    });
    const error = await limiter.acquire({ tokens: { input: 9_000, output: 1_500 } }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    expect((error as Error).message).toBe(
      'Request of 10500 tokens can never be granted by limiter `openai`: budget `tokens` (`rate.tokensPerMinute`) is 10000 per minute',
    );
    expect(error).toMatchObject({ field: 'tokens', value: 10_500, limiter: 'openai' });
    await expect(limiter.acquire({ tokens: { output: 2_001 } })).rejects.toThrow(
      'budget `outputTokens` (`rate.outputTokensPerMinute`) is 2000 per minute',
    );
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('refuses token counts that are not finite numbers >= 0, naming the field and the value', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 2, rate: { tokensPerMinute: 10_000 } });
    const bad: [unknown, string, string][] = [
      [{ input: Number.NaN }, 'tokens.input', 'got `NaN`'],
      [{ output: -1 }, 'tokens.output', 'got `-1`'],
      [{ input: Infinity }, 'tokens.input', 'got `Infinity`'],
      [{ input: '100' }, 'tokens.input', 'got `100`'],
      [42, 'tokens', 'got `42`'],
      [null, 'tokens', 'got `null`'],
    ];
    for (const [tokens, field, got] of bad) {
      const error = await limiter.acquire({ tokens: tokens as never }).catch((e: unknown) => e);
      expect(error, JSON.stringify(tokens)).toBeInstanceOf(ConcurrencyConfigError);
      expect(error).toMatchObject({ field });
      expect((error as Error).message).toContain(got);
    }
    // A huge count with no budget to exceed is only counted.
    const unlimited = createConcurrencyLimiter({ maxConcurrent: 1 });
    await unlimited.release(await unlimited.acquire({ tokens: { input: 1e15 } }));
  });

  it('validates `rate`: each figure a positive finite number, requests at least 1', () => {
    const cases: [unknown, string][] = [
      [{ tokensPerMinute: 0 }, 'Expected `rate.tokensPerMinute` to be a positive finite number, got `0`'],
      [{ tokensPerMinute: -5 }, 'Expected `rate.tokensPerMinute` to be a positive finite number, got `-5`'],
      [
        { inputTokensPerMinute: Number.NaN },
        'Expected `rate.inputTokensPerMinute` to be a positive finite number, got `NaN`',
      ],
      [
        { outputTokensPerMinute: Infinity },
        'Expected `rate.outputTokensPerMinute` to be a positive finite number, got `Infinity`',
      ],
      [
        { requestsPerMinute: '500' },
        'Expected `rate.requestsPerMinute` to be a positive finite number, got `"500"`',
      ],
      [
        { requestsPerMinute: 0.5 },
        'Expected `rate.requestsPerMinute` to be a finite number >= 1 (each request takes 1), got `0.5`',
      ],
      [
        { tokenPerMinute: 5 },
        'Expected `rate.tokenPerMinute` to be a known rate option (misspelt?), got `"tokenPerMinute"`',
      ],
      [
        JSON.parse('{"__proto__": 5}'),
        'Expected `rate.__proto__` to be a known rate option (misspelt?), got `"__proto__"`',
      ],
      [[], 'Expected `rate` to be an object, got `[]`'],
      [7, 'Expected `rate` to be an object, got `7`'],
    ];
    for (const [rate, message] of cases) {
      let error: unknown;
      try {
        createConcurrencyLimiter({ maxConcurrent: 2, rate: rate as never });
      } catch (e) {
        error = e;
      }
      expect(error, JSON.stringify(rate)).toBeInstanceOf(ConcurrencyConfigError);
      expect((error as Error).message).toContain(message);
    }
  });
});

describe('a head that does not fit a budget yet', () => {
  it('blocks later requests of its priority, so small ones cannot starve a large one', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 10,
      rate: { tokensPerMinute: 60_000 }, // 1,000 a second
      workloads: { a: {}, b: {} },
      clock,
    });
    const first = await limiter.acquire({ workload: 'a', tokens: { input: 59_000 } });
    const order: string[] = [];
    const ask = (label: string, workload: 'a' | 'b', input: number) =>
      limiter.acquire({ workload, tokens: { input } }).then((lease) => (order.push(label), lease));
    const large = ask('large', 'b', 30_000);
    await flush();
    const small = [ask('small-a', 'a', 100), ask('small-b', 'b', 100)];
    // 1,000 are left: the small ones would fit, but they arrived after the large one.
    await advance(clock, 28_999);
    expect(order).toEqual([]);
    await advance(clock, 1);
    expect(order).toEqual(['large', 'small-a', 'small-b'].slice(0, 1));
    // After the large grant the bucket is empty again: 100 more tokens take 0.1 s.
    await advance(clock, 100);
    expect(order).toEqual(['large', 'small-a']);
    await advance(clock, 100);
    expect(order).toEqual(['large', 'small-a', 'small-b']);
    for (const lease of [first, await large, ...(await Promise.all(small))]) await limiter.release(lease);
  });

  it('a workload of higher priority still goes first, as it does for slots', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 10,
      rate: { tokensPerMinute: 60_000 },
      workloads: { urgent: { priority: 10 }, bulk: {} },
      clock,
    });
    const first = await limiter.acquire({ workload: 'bulk', tokens: { input: 59_000 } });
    const large = track(limiter.acquire({ workload: 'bulk', tokens: { input: 30_000 } }));
    await flush();
    const urgent = await limiter.acquire({ workload: 'urgent', tokens: { input: 500 } });
    expect(large.settled).toBe(false);
    await advance(clock, 29_499);
    expect(large.settled).toBe(false);
    await advance(clock, 1);
    expect(large.value).toBeDefined();
    for (const lease of [first, urgent, large.value!]) await limiter.release(lease);
  });

  it('with token budgets only, a request without tokens may use a free slot meanwhile', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 3,
      rate: { tokensPerMinute: 6_000 },
      workloads: { chat: {}, tools: {} },
      clock,
    });
    const first = await limiter.acquire({ workload: 'chat', tokens: { input: 6_000 } });
    const large = track(limiter.acquire({ workload: 'chat', tokens: { input: 3_000 } }));
    await flush();
    // Another workload: its own queue is not behind the large request.
    const tokenless = await limiter.acquire({ workload: 'tools' });
    expect(large.settled).toBe(false);
    await advance(clock, 30_000);
    expect(large.value).toBeDefined();
    for (const lease of [first, tokenless, large.value!]) await limiter.release(lease);
  });

  it('waits for a budget as for a slot: timeoutMs, maxWaitMs and the signal end it', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 5,
      rate: { requestsPerMinute: 1 },
      workloads: { quick: { maxWaitMs: 2_000 }, patient: {} },
      clock,
    });
    const first = await limiter.acquire({ workload: 'patient' });
    const byBudget = track(limiter.acquire({ workload: 'patient', timeoutMs: 500 }));
    const byMaxWait = track(limiter.acquire({ workload: 'quick' }));
    const controller = new AbortController();
    const bySignal = track(limiter.acquire({ workload: 'patient', signal: controller.signal }));
    const zero = await limiter.acquire({ workload: 'patient', timeoutMs: 0 }).catch((e: unknown) => e);
    expect(zero).toBeInstanceOf(ConcurrencyTimeoutError);
    await advance(clock, 500);
    expect(byBudget.error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(byBudget.error).toMatchObject({ waitMs: 500, timeoutMs: 500 });
    await advance(clock, 1_500);
    expect(byMaxWait.error).toBeInstanceOf(ConcurrencyTimeoutError);
    const reason = new Error('gave up');
    controller.abort(reason);
    await flush();
    expect(bySignal.error).toBe(reason);
    expect(limiter.stats()).toMatchObject({ active: 1, queued: 0 });
    await limiter.release(first);
    // Nobody waits: no wake timer is left (the lease sweep goes at the lease's old expiry).
    await advance(clock, 30_000);
    expect(clock.pendingTimers).toBe(0);
  });
});

describe('settling a grant at release', () => {
  const make = (clock: ManualClock) =>
    createConcurrencyLimiter({ maxConcurrent: 4, rate: { tokensPerMinute: 10_000 }, clock });

  it('refunds what the usage left of the estimate, and charges what it went over', async () => {
    const clock = new ManualClock();
    const limiter = make(clock);
    const a = await limiter.acquire({ tokens: { input: 2_000, output: 1_000 } });
    const b = await limiter.acquire({ tokens: { input: 2_000, output: 1_000 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(4_000);
    await limiter.release(a, { usage: { input: 950, output: 312 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(4_000 + 3_000 - 1_262);
    await limiter.release(b, { usage: { input: 2_000, output: 3_000 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(5_738 - 2_000);
  });

  it('a release without usage keeps the estimate; a part missing or garbage keeps its estimate', async () => {
    const clock = new ManualClock();
    const limiter = make(clock);
    await limiter.release(await limiter.acquire({ tokens: { input: 1_000, output: 1_000 } }));
    expect(limiter.stats().budgets?.tokens?.available).toBe(8_000);
    const lease = await limiter.acquire({ tokens: { input: 1_000, output: 1_000 } });
    await limiter.release(lease, { usage: { input: Number.NaN, output: -5 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(6_000);
    const other = await limiter.acquire({ tokens: { input: 1_000, output: 1_000 } });
    await limiter.release(other, { usage: { output: 0 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(5_000);
    // A second release of a lease settles nothing more.
    await limiter.release(other, { usage: { output: 0, input: 0 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(5_000);
  });

  it('a refund never fills a bucket past its figure, also after it refilled', async () => {
    const clock = new ManualClock();
    const limiter = make(clock);
    const lease = await limiter.acquire({ tokens: { input: 5_000 } });
    await advance(clock, 60_000); // full again
    await limiter.release(lease, { usage: { input: 0, output: 0 } });
    expect(limiter.stats().budgets?.tokens).toEqual({ available: 10_000, capacity: 10_000 });
  });

  it('a usage far over the bucket puts it at most one figure in debt', async () => {
    const clock = new ManualClock();
    const limiter = make(clock);
    const lease = await limiter.acquire({ tokens: { input: 100 } });
    await limiter.release(lease, { usage: { input: 1e300, output: 1e300 } });
    expect(limiter.stats().budgets?.tokens?.available).toBe(0);
    const next = track(limiter.acquire({ tokens: { input: 1 } }));
    // One figure of debt, then one token: a minute and 6 ms.
    await advance(clock, 60_005);
    expect(next.settled).toBe(false);
    await advance(clock, 1);
    expect(next.value).toBeDefined();
    await limiter.release(next.value!);
  });

  it('a clock that steps back neither refills twice nor freezes the budget', async () => {
    const clock = new ManualClock();
    const limiter = make(clock);
    await limiter.release(await limiter.acquire({ tokens: { input: 10_000 } }));
    await advance(clock, -3_600_000); // an hour back
    expect(limiter.stats().budgets?.tokens?.available).toBe(0);
    await advance(clock, 6_000); // 6 s of refill, counted from the new time
    expect(limiter.stats().budgets?.tokens?.available).toBe(1_000);
    await advance(clock, 3_600_000); // back where it was, and more: full, never past it
    expect(limiter.stats().budgets?.tokens?.available).toBe(10_000);
  });
});

describe("the provider's feedback", () => {
  function setup(rate?: { requestsPerMinute?: number; tokensPerMinute?: number }) {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ name: 'p', maxConcurrent: 4, clock, ...(rate && { rate }) });
    const events: ConcurrencyEvent[] = [];
    const stop = limiter.subscribe((event) => events.push(event));
    return { clock, limiter, events, stop };
  }

  async function pausedFor(
    clock: ManualClock,
    limiter: ReturnType<typeof setup>['limiter'],
    ms: number,
  ): Promise<void> {
    const next = track(limiter.acquire());
    await advance(clock, ms - 1);
    expect(next.settled, `still paused at ${ms - 1} ms`).toBe(false);
    await advance(clock, 1);
    expect(next.value, `granted at ${ms} ms`).toBeDefined();
    await limiter.release(next.value!);
  }

  it('a 429, 503 or 529 pauses every new grant for retryAfterMs, 1 s when none is given', async () => {
    for (const status of [429, 503, 529]) {
      const { clock, limiter, events } = setup();
      await limiter.release(await limiter.acquire(), { provider: { status } });
      expect(events).toEqual([
        {
          type: 'provider-throttled',
          limiter: 'p',
          workload: 'default',
          at: clock.now(),
          status,
          retryAfterMs: 1_000,
        },
      ]);
      await pausedFor(clock, limiter, 1_000);
    }
    const { clock, limiter, events } = setup();
    await limiter.release(await limiter.acquire(), { provider: { status: 429, retryAfterMs: 2_500 } });
    expect(events[0]).toMatchObject({ status: 429, retryAfterMs: 2_500 });
    await pausedFor(clock, limiter, 2_500);
    // From the headers too, when the caller passed only `limits`.
    await limiter.release(await limiter.acquire(), {
      provider: { status: 429, limits: { retryAfterMs: 700 } },
    });
    await pausedFor(clock, limiter, 700);
  });

  it('a remaining of 0 pauses until that window resets; other statuses do not pause', async () => {
    const { clock, limiter, events } = setup();
    await limiter.release(await limiter.acquire(), {
      provider: {
        status: 200,
        limits: { tokens: { remaining: 0, resetMs: 1_500 }, requests: { remaining: 9 } },
      },
    });
    expect(events).toMatchObject([{ type: 'provider-throttled', status: 200, retryAfterMs: 1_500 }]);
    await pausedFor(clock, limiter, 1_500);
    for (const status of [200, 400, 500, 502]) {
      await limiter.release(await limiter.acquire(), { provider: { status } });
    }
    expect(events).toHaveLength(1);
  });

  it('caps a pause at a minute, however long the provider asks for', async () => {
    const { clock, limiter, events } = setup();
    await limiter.release(await limiter.acquire(), { provider: { status: 429, retryAfterMs: 1e12 } });
    expect(events[0]).toMatchObject({ retryAfterMs: 60_000 });
    await pausedFor(clock, limiter, 60_000);
    // Garbage numbers are ignored: the 1 s default.
    await limiter.release(await limiter.acquire(), {
      provider: { status: 429, retryAfterMs: Number.NaN, limits: { tokens: { remaining: -1, resetMs: -5 } } },
    });
    await pausedFor(clock, limiter, 1_000);
    // A clock that steps back does not stretch a pause past the cap.
    await limiter.release(await limiter.acquire(), { provider: { status: 429, retryAfterMs: 60_000 } });
    clock.advance(-3_600_000);
    await pausedFor(clock, limiter, 60_000);
  });

  it('the answer to a lease that already expired still pauses', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, leaseTtlMs: 100, clock });
    const lease = await limiter.acquire();
    await advance(clock, 200);
    await limiter.release(lease, { provider: { status: 429, retryAfterMs: 300 } });
    const next = track(limiter.acquire());
    await advance(clock, 299);
    expect(next.settled).toBe(false);
    await advance(clock, 1);
    expect(next.value).toBeDefined();
  });

  it('a remaining below the bucket lowers it (other clients spend the account too), never raises it', async () => {
    const { limiter } = setup({ requestsPerMinute: 100, tokensPerMinute: 10_000 });
    const lease = await limiter.acquire({ tokens: { input: 1_000 } });
    await limiter.release(lease, {
      usage: { input: 1_000 },
      provider: { status: 200, limits: { tokens: { remaining: 2_500 }, requests: { remaining: 5_000 } } },
    });
    expect(limiter.stats().budgets).toEqual({
      requests: { available: 99, capacity: 100 },
      tokens: { available: 2_500, capacity: 10_000 },
    });
  });

  it('unsubscribing stops the events; a throwing listener breaks nothing', async () => {
    const { limiter, events, stop } = setup();
    limiter.subscribe(() => {
      throw new Error('listener bug');
    });
    stop();
    await limiter.release(await limiter.acquire(), { provider: { status: 429 } });
    expect(events).toEqual([]);
  });
});
