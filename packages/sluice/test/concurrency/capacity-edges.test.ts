/**
 * Edges of budgets, settling, the pause and the adaptive limit that a hostile caller or an
 * unlucky operator reaches: figures at the top of the number range, a provider's `usage: null`,
 * reservations after a cut below what is held, grants at the pause's last millisecond, a
 * listener that acquires, and a lease released twice. All on a ManualClock.
 */
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ManualClock,
  createConcurrencyLimiter,
  systemClock,
  type ConcurrencyEvent,
} from 'sluice/concurrency';
import { adjust } from '../../src/concurrency/budgets.js';

function track<T>(promise: Promise<T>) {
  const state: { settled: boolean; value?: T; error?: unknown } = { settled: false };
  promise.then(
    (value) => Object.assign(state, { settled: true, value }),
    (error: unknown) => Object.assign(state, { settled: true, error }),
  );
  return state;
}

/** Resolved with a lease: settled, and not with an error. */
function granted(state: { settled: boolean; error?: unknown }): boolean {
  return state.settled && state.error === undefined;
}

describe('budgets at the top of the number range', () => {
  it('a figure of Number.MAX_VALUE waits for its refill instead of hanging the process', async () => {
    // `tokensPerMinute: Number.MAX_VALUE` is how an operator writes "no real limit"; the wait
    // for a request of that size once overflowed to Infinity and looped for ever.
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 4,
      rate: { tokensPerMinute: Number.MAX_VALUE },
      clock,
    });
    const first = await limiter.acquire({ tokens: { input: 1e308 } });
    const second = track(limiter.acquire({ tokens: { input: 1e308 } }));
    await flush();
    expect(second.settled).toBe(false);
    clock.advance(60_000);
    await flush();
    expect(granted(second)).toBe(true);
    await limiter.release(first);
    await limiter.release(second.value!);
  });
});

describe('estimates whose parts sum past the number range', () => {
  it('tokens of 1e308 + 1e308 are refused at acquire, and a learned token budget keeps granting', async () => {
    // Each part is finite, their sum is Infinity: under a learned budget (no configured figure
    // refuses it) the grant used to settle to Infinity - Infinity, a NaN bucket level, and the
    // next wait for a refill searched for ever, blocking the whole process.
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ name: 'huge', maxConcurrent: 4, adaptive: true, clock });
    const first = await limiter.acquire({});
    const limits = { tokens: { limit: 1000, remaining: 1000 } };
    await limiter.release(first, { provider: { status: 200, limits } });
    const refused = await limiter
      .acquire({ tokens: { input: 1e308, output: 1e308 } })
      .catch((e: unknown) => e);
    expect(refused).toMatchObject({ name: 'ConcurrencyConfigError', limiter: 'huge', field: 'tokens' });
    expect((refused as Error).message).toContain('tokens.input + tokens.output');
    expect((refused as Error).message).toContain('1e+308 + 1e+308');
    const next = await limiter.acquire({ tokens: { input: 400 } });
    await limiter.release(next, { usage: {} });
    expect(limiter.stats().budgets).toEqual({ tokens: { available: 600, capacity: 1000 } });
  });

  it('a NaN change to a bucket leaves its level as it was', () => {
    const levels = adjust({ tokens: 1000 }, { tokens: { level: 250, at: 0 } }, () => Infinity - Infinity, 0);
    expect(levels).toEqual({ tokens: { level: 250, at: 0 } });
  });
});

describe('settling garbage usage', () => {
  it('a release with `usage: null` (an OpenAI stream chunk) settles nothing and hands the slot on', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, rate: { tokensPerMinute: 1000 }, clock });
    const lease = await limiter.acquire({ tokens: { input: 400 } });
    const waiter = track(limiter.acquire({ tokens: { input: 100 } }));
    await limiter.release(lease, { usage: null as never, provider: { status: 200 } });
    await flush();
    expect(granted(waiter)).toBe(true);
    // The estimate stays charged: 1000 - 400 - 100.
    expect(limiter.stats().budgets?.tokens?.available).toBe(500);
    await limiter.release(waiter.value!, { usage: 7 as never });
  });
});

describe('reservations under a lowered adaptive limit', () => {
  it('a workload keeps every reserved slot after a cut below the shared slots already held', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 20,
      adaptive: true,
      workloads: { vip: { reserved: 2, priority: 10 }, bulk: {} },
      clock,
    });
    const bulk = await Promise.all(Array.from({ length: 18 }, () => limiter.acquire({ workload: 'bulk' })));
    // 20 -> 18: 16 shared slots now, and bulk still holds 17 of them.
    await limiter.release(bulk.pop()!, { provider: { status: 429, retryAfterMs: 1 } });
    clock.advance(1);
    expect(limiter.stats().limit).toBe(18);
    const vip = [track(limiter.acquire({ workload: 'vip' })), track(limiter.acquire({ workload: 'vip' }))];
    await flush();
    expect(vip.map(granted)).toEqual([true, true]);
    // Bulk gets no shared slot until it is back under the 16.
    const more = track(limiter.acquire({ workload: 'bulk' }));
    await limiter.release(bulk.pop()!);
    await flush();
    expect(more.settled).toBe(false);
    await limiter.release(bulk.pop()!);
    await flush();
    expect(granted(more)).toBe(true);
    expect(limiter.stats().active).toBe(2 + 16);
  });
});

describe('grants at the end of the pause', () => {
  it('a request arriving as the pause ends does not jump the requests that waited through it', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 1,
      workloads: { hi: { priority: 10 }, lo: {} },
      defaultWorkload: 'lo',
      clock,
    });
    const order: string[] = [];
    const lease = await limiter.acquire({ workload: 'lo' });
    // Any callback due at the pause's last millisecond (here a timer set earlier, in
    // production any I/O) runs before the limiter's own wake timer.
    clock.setTimeout(() => {
      void limiter.acquire({ workload: 'lo' }).then(() => order.push('lo, arrived at the end'));
    }, 1000);
    await limiter.release(lease, { provider: { status: 429, retryAfterMs: 1000 } });
    void limiter.acquire({ workload: 'hi' }).then(() => order.push('hi, waited through the pause'));
    clock.advance(1000);
    await flush();
    expect(order).toEqual(['hi, waited through the pause']);
  });
});

describe('events and re-entry', () => {
  it('a listener that acquires on provider-throttled does not jump the queue', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 1,
      workloads: { hi: { priority: 10 }, lo: {} },
      defaultWorkload: 'lo',
      clock,
    });
    const order: string[] = [];
    const lease = await limiter.acquire({ workload: 'lo' });
    void limiter.acquire({ workload: 'hi' }).then(() => order.push('hi, queued'));
    const unsubscribe = limiter.subscribe(() => {
      unsubscribe();
      void limiter.acquire({ workload: 'lo' }).then(() => order.push('lo, from the listener'));
    });
    await limiter.release(lease, { provider: { status: 429, retryAfterMs: 0 } });
    await flush();
    expect(order).toEqual(['hi, queued']);
  });
});

describe('releasing twice', () => {
  it('the second release of a lease with the same 429 neither stretches the pause nor throttles again', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 2, adaptive: true, clock });
    const events: ConcurrencyEvent['type'][] = [];
    limiter.subscribe((event) => events.push(event.type));
    const lease = await limiter.acquire();
    const details = { provider: { status: 429, retryAfterMs: 1000 } };
    await limiter.release(lease, details);
    clock.advance(900);
    await limiter.release(lease, details);
    clock.advance(100);
    const next = track(limiter.acquire({ timeoutMs: 1 }));
    await flush();
    expect(granted(next)).toBe(true);
    expect(events).toEqual(['provider-throttled', 'limit-changed']);
  });
});

describe('names that are Object.prototype members', () => {
  it('stats() lists workloads named __proto__ and constructor as their own entries, beside the budgets', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 4,
      workloads: JSON.parse('{"__proto__": {"reserved": 1}, "constructor": {}}') as Record<
        '__proto__' | 'constructor',
        { reserved?: number }
      >,
      defaultWorkload: 'constructor',
      rate: { tokensPerMinute: 100 },
      adaptive: true,
      clock,
    });
    const a = await limiter.acquire({ workload: '__proto__', key: '__proto__', tokens: { input: 10 } });
    const b = await limiter.acquire({ key: 'constructor', tokens: { input: 10 } });
    const stats = limiter.stats();
    expect(Object.getPrototypeOf(stats.workloads)).toBe(Object.prototype);
    expect(JSON.parse(JSON.stringify(stats))).toEqual({
      active: 2,
      queued: 0,
      limit: 4,
      budgets: { tokens: { available: 80, capacity: 100 } },
      workloads: { ['__proto__']: { active: 1, queued: 0 }, constructor: { active: 1, queued: 0 } },
    });
    await limiter.release(a, { usage: { input: 5 } });
    await limiter.release(b);
    expect(limiter.stats().budgets).toEqual({ tokens: { available: 85, capacity: 100 } });
  });
});

describe('waits longer than a Node timer', () => {
  it('on the system clock, a wait of timeoutMs 3e9 (past 2^31 - 1 ms) does not time out at once', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const held = await limiter.acquire();
    const controller = new AbortController();
    const waiter = track(limiter.acquire({ timeoutMs: 3_000_000_000, signal: controller.signal }));
    // Node fires a timer past its range after 1 ms; give it many times that.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(waiter.settled).toBe(false);
    controller.abort(new Error('done'));
    await flush();
    expect(waiter.error).toEqual(new Error('done'));
    await limiter.release(held);
  });

  it('systemClock does not fire a timer set past 2^31 - 1 ms after 1 ms', async () => {
    let fired = false;
    const timer = systemClock.setTimeout(() => (fired = true), 2 ** 31 + 5, { background: true });
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(fired).toBe(false);
    systemClock.clearTimeout(timer);
  });
});
