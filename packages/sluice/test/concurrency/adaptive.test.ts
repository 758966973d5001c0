/**
 * The adaptive concurrency limit of the in-memory limiter, on a ManualClock: one decrease per
 * burst of overload answers, additive increase only while the limit is in use, the floor of
 * the reservations, and no upward creep under steady overload (Netflix
 * concurrency-limits#134, #137).
 */
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  ManualClock,
  createConcurrencyLimiter,
  type ConcurrencyEvent,
  type ConcurrencyLease,
} from 'sluice/concurrency';

function limitChanges(events: ConcurrencyEvent[]) {
  return events.flatMap((e) => (e.type === 'limit-changed' ? [[e.from, e.to, e.reason]] : []));
}

describe('adaptive options', () => {
  it('starts at maxConcurrent; minConcurrent defaults to the reservations, plus 1 when a workload has none', () => {
    const plain = createConcurrencyLimiter({ maxConcurrent: 8, adaptive: true });
    expect(plain.limits.adaptive).toEqual({ minConcurrent: 1 });
    expect(plain.stats().limit).toBe(8);
    const reserved = createConcurrencyLimiter({
      maxConcurrent: 8,
      adaptive: {},
      workloads: { vip: { reserved: 2 }, bulk: {} },
    });
    expect(reserved.limits.adaptive).toEqual({ minConcurrent: 3 });
    const allReserved = createConcurrencyLimiter({
      maxConcurrent: 8,
      adaptive: true,
      workloads: { a: { reserved: 2 }, b: { reserved: 3 } },
    });
    expect(allReserved.limits.adaptive).toEqual({ minConcurrent: 5 });
    expect(createConcurrencyLimiter({ maxConcurrent: 8, adaptive: false }).limits.adaptive).toBeUndefined();
    expect(createConcurrencyLimiter({ maxConcurrent: 8 }).stats().limit).toBe(8);
  });

  it('refuses a minConcurrent below the reservations or above maxConcurrent, naming field and value', () => {
    const cases: [unknown, string][] = [
      [
        { minConcurrent: 2 },
        'Expected `adaptive.minConcurrent` to be a whole number between 3 (the reservations, plus 1 when a workload reserves none) and 8 (maxConcurrent), got `2`',
      ],
      [{ minConcurrent: 9 }, 'got `9`'],
      [{ minConcurrent: 3.5 }, 'got `3.5`'],
      [{ minConcurrent: Number.NaN }, 'got `NaN`'],
      [{ minimum: 3 }, 'Expected `adaptive.minimum` to be a known adaptive option (misspelt?)'],
      ['yes', 'Expected `adaptive` to be true, false or an object, got `"yes"`'],
    ];
    for (const [adaptive, message] of cases) {
      expect(() =>
        createConcurrencyLimiter({
          maxConcurrent: 8,
          adaptive: adaptive as never,
          workloads: { vip: { reserved: 2 }, bulk: {} },
        }),
      ).toThrow(message);
    }
    expect(() => createConcurrencyLimiter({ maxConcurrent: 8, adaptive: 'yes' as never })).toThrow(
      ConcurrencyConfigError,
    );
  });
});

describe('the adaptive limit', () => {
  function setup(maxConcurrent = 10) {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ name: 'a', maxConcurrent, adaptive: true, clock });
    const events: ConcurrencyEvent[] = [];
    limiter.subscribe((event) => events.push(event));
    return { clock, limiter, events };
  }

  it('one burst of 429s, all sent before the decrease, lowers the limit once', async () => {
    const { clock, limiter, events } = setup();
    const leases = await Promise.all(Array.from({ length: 10 }, () => limiter.acquire()));
    for (const lease of leases) await limiter.release(lease, { provider: { status: 429, retryAfterMs: 10 } });
    expect(limitChanges(events)).toEqual([[10, 9, 'overload']]);
    expect(limiter.stats().limit).toBe(9);
    // Every answer paused (a provider-throttled each), but the limit moved once.
    expect(events.filter((e) => e.type === 'provider-throttled')).toHaveLength(10);
    clock.advance(10);
    // A 429 to a request granted after the decrease is news: it lowers again.
    const later = await limiter.acquire();
    await limiter.release(later, { provider: { status: 503 } });
    expect(limitChanges(events)).toEqual([
      [10, 9, 'overload'],
      [9, 8, 'overload'],
    ]);
  });

  it('rises by 1 per `limit` successful releases made while the limit is in use; back to a refused limit takes 10 windows', async () => {
    const { clock, limiter, events } = setup(30);
    await limiter.release(await limiter.acquire(), { provider: { status: 429, retryAfterMs: 1 } });
    clock.advance(1);
    expect(limiter.stats().limit).toBe(27);
    // Releases while fewer than 27 are held say nothing about the limit.
    for (let i = 0; i < 100; i++)
      await limiter.release(await limiter.acquire(), { provider: { status: 200 } });
    expect(limiter.stats().limit).toBe(27);
    // Held at the limit: each release comes with all slots held, and a new one takes its place.
    const held: ConcurrencyLease<'default'>[] = [];
    const cycle = async (n: number) => {
      for (let i = 0; i < n; i++) {
        await limiter.release(held.shift()!, { provider: { status: 200 } });
        held.push(await limiter.acquire());
      }
    };
    while (held.length < 27) held.push(await limiter.acquire());
    await cycle(26);
    expect(limiter.stats().limit).toBe(27);
    await cycle(1);
    expect(limiter.stats().limit).toBe(28);
    held.push(await limiter.acquire());
    await cycle(28);
    expect(limiter.stats().limit).toBe(29);
    held.push(await limiter.acquire());
    // 30 was refused: ten windows of 29 before trying it again.
    await cycle(289);
    expect(limiter.stats().limit).toBe(29);
    await cycle(1);
    expect(limitChanges(events)).toEqual([
      [30, 27, 'overload'],
      [27, 28, 'increase'],
      [28, 29, 'increase'],
      [29, 30, 'increase'],
    ]);
    // At maxConcurrent it stays there.
    held.push(await limiter.acquire());
    await cycle(100);
    expect(limiter.stats().limit).toBe(30);
    // A release without details, or a failed request, counts for nothing.
    for (const lease of held) await limiter.release(lease);
  });

  it('never goes below the reservations, which stay strict inside the lowered limit', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 10,
      adaptive: true,
      workloads: { vip: { reserved: 2 }, bulk: {} },
      clock,
    });
    for (let i = 0; i < 30; i++) {
      await limiter.release(await limiter.acquire({ workload: 'bulk' }), {
        provider: { status: 429, retryAfterMs: 1 },
      });
      clock.advance(1);
    }
    expect(limiter.stats().limit).toBe(3);
    // One shared slot is left for bulk; vip keeps both of its own.
    const bulk = await limiter.acquire({ workload: 'bulk' });
    const more = limiter.acquire({ workload: 'bulk', timeoutMs: 0 }).catch((e: unknown) => e);
    expect(await more).toMatchObject({ name: 'ConcurrencyTimeoutError' });
    const vip = await Promise.all([
      limiter.acquire({ workload: 'vip' }),
      limiter.acquire({ workload: 'vip' }),
    ]);
    for (const lease of [bulk, ...vip]) await limiter.release(lease);
  });
});

/**
 * A provider that serves at most `capacity` requests at once, answers the others 429 at once,
 * and takes `latencyMs` per request; `workers` agents send request after request through the
 * limiter. Everything runs on the manual clock, in 10 ms steps.
 */
async function steadyOverload(options: {
  capacity: number;
  maxConcurrent: number;
  workers: number;
  latencyMs: number;
  retryAfterMs: number | undefined;
  seconds: number;
}) {
  const clock = new ManualClock(0);
  const limiter = createConcurrencyLimiter({
    maxConcurrent: options.maxConcurrent,
    adaptive: true,
    leaseTtlMs: 10 * 60_000,
    clock,
  });
  const limits: { at: number; limit: number }[] = [];
  const answers: { at: number; status: number }[] = [];
  let inFlight = 0;
  let stopped = false;
  const wait = (ms: number) => new Promise<void>((resolve) => clock.setTimeout(resolve, ms));
  const worker = async () => {
    while (!stopped) {
      const lease = await limiter.acquire();
      if (inFlight >= options.capacity) {
        answers.push({ at: clock.now(), status: 429 });
        await limiter.release(lease, { provider: { status: 429, retryAfterMs: options.retryAfterMs } });
        continue;
      }
      inFlight++;
      await wait(options.latencyMs);
      inFlight--;
      answers.push({ at: clock.now(), status: 200 });
      await limiter.release(lease, { provider: { status: 200 }, usage: { input: 100, output: 20 } });
    }
  };
  const running = Array.from({ length: options.workers }, worker);
  for (let t = 0; t < options.seconds * 1000; t += 10) {
    clock.advance(10);
    await flush();
    limits.push({ at: clock.now(), limit: limiter.stats().limit! });
  }
  stopped = true;
  // Let every worker finish its request and leave.
  for (let i = 0; i < 200 && limiter.stats().active + limiter.stats().queued > 0; i++) {
    clock.advance(options.latencyMs);
    await flush();
  }
  void running;
  return { limits, answers };
}

describe('no upward creep under steady overload', () => {
  it('keeps the limit oscillating around the provider capacity, never walking up to maxConcurrent', async () => {
    const capacity = 5;
    const { limits, answers } = await steadyOverload({
      capacity,
      maxConcurrent: 20,
      workers: 40,
      latencyMs: 200,
      retryAfterMs: 100,
      seconds: 120,
    });
    const settled = limits.filter((l) => l.at >= 15_000).map((l) => l.limit);
    // From 20 down to the capacity, then between it and one above, for the remaining 105 s.
    expect(Math.max(...settled)).toBeLessThanOrEqual(capacity + 1);
    expect(Math.min(...settled)).toBeGreaterThanOrEqual(capacity - 1);
    const late = limits.filter((l) => l.at >= 100_000).map((l) => l.limit);
    expect(Math.max(...late)).toBeLessThanOrEqual(capacity + 1);
    // The probe above the capacity is all the overload: few 429s, the account busy.
    const after = answers.filter((a) => a.at >= 15_000);
    const refused = after.filter((a) => a.status === 429).length;
    const served = after.length - refused;
    // About 1 in 57 at this small capacity (measured: 0.018), against 1 in 11 when the step
    // back to a refused limit took one window.
    expect(refused / after.length).toBeLessThan(0.03);
    // At 5 at once and 200 ms each the account serves 25 a second at most.
    expect(served / 105).toBeGreaterThan(0.8 * 25);
  });

  it("settles near the bench's account (20 at once) from maxConcurrent 64, and stays there", async () => {
    // The account of bench:capacity seen from its concurrency side only: 20 at once, 1 s
    // retry-after on a refusal (the stand-in's), requests of 700 ms, more agents than slots.
    const capacity = 20;
    const { limits, answers } = await steadyOverload({
      capacity,
      maxConcurrent: 64,
      workers: 96,
      latencyMs: 700,
      retryAfterMs: 1_000,
      seconds: 120,
    });
    const settled = limits.filter((l) => l.at >= 15_000).map((l) => l.limit);
    expect(Math.max(...settled)).toBeLessThanOrEqual(capacity + 1);
    expect(Math.min(...settled)).toBeGreaterThanOrEqual(capacity - 3);
    expect(limits.at(-1)!.limit).toBeLessThanOrEqual(capacity + 1);
    // No creep: in the last minute too, at most one above the capacity.
    const late = limits.filter((l) => l.at >= 60_000).map((l) => l.limit);
    expect(Math.max(...late)).toBeLessThanOrEqual(capacity + 1);
    const after = answers.filter((a) => a.at >= 15_000);
    const refused = after.filter((a) => a.status === 429).length;
    // Measured: 3.7 per 1,000 answers after 15 s (the goal of bench:capacity is 5), the limit
    // between 18 and 20: one probe at 21 every ten windows of 20.
    expect((1000 * refused) / after.length).toBeLessThan(5);
    // 20 at once for 700 ms each: the account serves 28.6 a second at most.
    expect((after.length - refused) / 105).toBeGreaterThan(0.9 * (capacity / 0.7));
  });

  it('holds around the capacity with the 1 s default pause too', async () => {
    const { limits } = await steadyOverload({
      capacity: 8,
      maxConcurrent: 32,
      workers: 64,
      latencyMs: 500,
      retryAfterMs: undefined,
      seconds: 120,
    });
    const settled = limits.filter((l) => l.at >= 30_000).map((l) => l.limit);
    expect(Math.max(...settled)).toBeLessThanOrEqual(9);
    expect(Math.min(...settled)).toBeGreaterThanOrEqual(7);
  });
});
