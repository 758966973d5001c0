import { getEventListeners } from 'node:events';
import { setImmediate as flush } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  ConcurrencyLeaseLostError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  acquireSlot,
  ManualClock,
  createConcurrencyLimiter,
  type ConcurrencyEvent,
  type ConcurrencyEventType,
  type ConcurrencyLimiter,
} from 'sluice/concurrency';
import { common, emitted, faulty, lineage, setup } from './slot-fixture.js';

// The event types this file's own tests emit (a worker may have run slot-errors.test.ts, which
// shares the fixture, before it).
beforeAll(() => emitted.clear());

// Every event type, checked by the compiler: a new member of ConcurrencyEventType that is not
// listed here fails the type check.
const everyType = {
  'wait-started': true,
  acquired: true,
  'timed-out': true,
  'queue-full': true,
  'wait-cancelled': true,
  'limiter-error': true,
  'config-error': true,
  released: true,
  'renewal-failed': true,
  'lease-lost': true,
  'release-failed': true,
  'provider-throttled': true,
  'limit-changed': true,
} satisfies Record<ConcurrencyEventType, true>;

describe('slot lifecycle and events', () => {
  it('wait-started, acquired and released carry every field', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const slot = await acquireSlot({
      limiter,
      workload: 'interactive',
      timeoutMs: 5000,
      clock,
      onEvent,
      ...lineage,
    });
    clock.advance(250);
    await slot.release('completed');
    await slot.release('failed'); // idempotent: no second event
    expect(events).toEqual([
      { type: 'wait-started', ...common, at: 1_000_000, deadline: 1_005_000 },
      { type: 'acquired', ...common, at: 1_000_000, leaseId: slot.lease.id, waitMs: 0 },
      {
        type: 'released',
        ...common,
        at: 1_000_250,
        leaseId: slot.lease.id,
        holdMs: 250,
        outcome: 'completed',
      },
    ]);
    expect(limiter.stats().active).toBe(0);
  });

  it("wait-started's deadline is the sooner of the run's budget and the workload's maxWaitMs", async () => {
    const clock = new ManualClock(1_000_000);
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 1,
      clock,
      workloads: { quick: { maxWaitMs: 2_000 }, patient: {} },
      defaultWorkload: 'patient',
    });
    const deadlines: (number | undefined)[] = [];
    const onEvent = (e: ConcurrencyEvent) => {
      if (e.type === 'wait-started') deadlines.push(e.deadline);
    };
    for (const request of [
      { workload: 'quick', timeoutMs: 5_000 },
      { workload: 'quick', timeoutMs: 500 },
      { workload: 'quick' },
      { workload: 'patient', timeoutMs: 5_000 },
      { workload: 'patient' },
    ] as const) {
      const slot = await acquireSlot({ limiter, clock, onEvent, ...request });
      await slot.release();
    }
    expect(deadlines).toEqual([1_002_000, 1_000_500, 1_002_000, 1_005_000, undefined]);
  });

  it('measures the wait of a queued request', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const first = await acquireSlot({ limiter, clock });
    const second = acquireSlot({ limiter, workload: 'interactive', clock, onEvent, ...lineage });
    clock.advance(700);
    await first.release();
    const slot = await second;
    expect(events.at(-1)).toEqual({
      type: 'acquired',
      ...common,
      at: 1_000_700,
      leaseId: slot.lease.id,
      waitMs: 700,
    });
    await slot.release('cancelled');
    expect(events.at(-1)).toMatchObject({ type: 'released', outcome: 'cancelled', holdMs: 0 });
  });

  it('renews while held, so the slot survives many ttls', async () => {
    const { clock, limiter, onEvent, types } = setup({ leaseTtlMs: 3000 });
    const slot = await acquireSlot({ limiter, clock, onEvent });
    const rival = acquireSlot({ limiter, clock, timeoutMs: 20_000 }).catch((e: unknown) => e);
    for (let t = 0; t < 15_000; t += 500) {
      clock.advance(500);
      await flush();
    }
    expect(slot.signal.aborted).toBe(false);
    expect(slot.lease.expiresAt).toBeGreaterThan(clock.now());
    expect(limiter.stats()).toMatchObject({ active: 1, queued: 1 });
    await slot.release();
    const next = await rival;
    expect(next).not.toBeInstanceOf(Error);
    expect(types()).toEqual(['wait-started', 'acquired', 'released']);
  });

  it('renewal-failed, then lease-lost and an aborted signal when renewal keeps failing', async () => {
    const { clock, limiter, events, onEvent, types } = setup({ leaseTtlMs: 3000 });
    const failure = new Error('connection reset');
    const flaky = faulty(limiter, { renew: failure });
    const slot = await acquireSlot({ limiter: flaky, workload: 'interactive', clock, onEvent, ...lineage });
    clock.advance(1000);
    await flush();
    expect(events.at(-1)).toEqual({
      type: 'renewal-failed',
      ...common,
      at: 1_001_000,
      leaseId: slot.lease.id,
      error: failure,
    });
    expect(slot.signal.aborted).toBe(false);
    clock.advance(1000);
    await flush();
    // The next try would come after expiry: the request is stopped now.
    expect(types()).toEqual(['wait-started', 'acquired', 'renewal-failed', 'renewal-failed', 'lease-lost']);
    expect(events.at(-1)).toEqual({
      type: 'lease-lost',
      ...common,
      at: 1_002_000,
      leaseId: slot.lease.id,
      holdMs: 2000,
    });
    const reason = slot.signal.reason as ConcurrencyLeaseLostError;
    expect(reason).toBeInstanceOf(ConcurrencyLeaseLostError);
    expect(reason).toMatchObject({ ...common, leaseId: slot.lease.id, holdMs: 2000 });
    await slot.release('failed');
    expect(types().at(-1)).toBe('lease-lost');
  });

  it('lease-lost when the limiter no longer holds the lease', async () => {
    const { clock, limiter, onEvent, types } = setup();
    const slot = await acquireSlot({ limiter, clock, onEvent });
    await limiter.release(slot.lease); // taken away behind the slot's back
    clock.advance(1000);
    await flush();
    expect(types()).toEqual(['wait-started', 'acquired', 'lease-lost']);
    expect(slot.signal.reason).toBeInstanceOf(ConcurrencyLeaseLostError);
  });

  it('release-failed when the limiter cannot take the slot back; release still resolves', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const failure = new Error('database gone');
    const slot = await acquireSlot({
      limiter: faulty(limiter, { release: failure }),
      workload: 'interactive',
      clock,
      onEvent,
      ...lineage,
    });
    await expect(slot.release()).resolves.toBeUndefined();
    expect(events.at(-1)).toEqual({
      type: 'release-failed',
      ...common,
      at: 1_000_000,
      leaseId: slot.lease.id,
      error: failure,
    });
  });

  it('timed-out with the wait, and ConcurrencyTimeoutError with every field', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const holder = await acquireSlot({ limiter, clock });
    const pending = acquireSlot({
      limiter,
      workload: 'interactive',
      timeoutMs: 400,
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    clock.advance(400);
    const error = await pending;
    expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(error).toMatchObject({ ...common, waitMs: 400, timeoutMs: 400 });
    expect(events.at(-1)).toEqual({ type: 'timed-out', ...common, at: 1_000_400, waitMs: 400 });
    await holder.release();
  });

  it('queue-full, and ConcurrencyQueueFullError with every field', async () => {
    const { clock, limiter, events, onEvent } = setup({ maxQueued: 0 });
    const holder = await acquireSlot({ limiter, clock });
    const error = await acquireSlot({ limiter, workload: 'interactive', clock, onEvent, ...lineage }).catch(
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ConcurrencyQueueFullError);
    expect(error).toMatchObject({ ...common, maxQueued: 0, queued: 0 });
    expect(events.at(-1)).toEqual({ type: 'queue-full', ...common, at: 1_000_000, waitMs: 0 });
    await holder.release();
  });

  it('wait-cancelled, rejecting with the signal reason', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const holder = await acquireSlot({ limiter, clock });
    const controller = new AbortController();
    const pending = acquireSlot({
      limiter,
      workload: 'interactive',
      signal: controller.signal,
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    clock.advance(50);
    const reason = new Error('user closed the tab');
    controller.abort(reason);
    expect(await pending).toBe(reason);
    expect(events.at(-1)).toEqual({ type: 'wait-cancelled', ...common, at: 1_000_050, waitMs: 50 });
    expect(limiter.stats()).toMatchObject({ active: 1, queued: 0 });
    await holder.release();
  });

  it('a slot granted at the moment of cancellation goes straight back', async () => {
    const { clock, limiter, onEvent, types } = setup();
    const holder = await acquireSlot({ limiter, clock });
    const controller = new AbortController();
    const pending = acquireSlot({ limiter, signal: controller.signal, clock, onEvent }).catch(
      (e: unknown) => e,
    );
    await flush();
    // Same tick: the limiter grants (synchronously), then the caller cancels.
    void holder.release();
    controller.abort(new Error('too late'));
    expect(await pending).toBe(controller.signal.reason);
    expect(types()).toEqual(['wait-started', 'wait-cancelled']);
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('limiter-error wraps an unexpected failure as ConcurrencyLimiterError with its cause', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const failure = new Error('ECONNREFUSED 127.0.0.1:5432');
    const error = await acquireSlot({
      limiter: faulty(limiter, { acquire: failure }),
      workload: 'interactive',
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyLimiterError);
    expect(error).toMatchObject({
      ...common,
      message: 'Limiter `claude` failed: ECONNREFUSED 127.0.0.1:5432',
    });
    expect((error as Error).cause).toBe(failure);
    expect(events.at(-1)).toEqual({ type: 'limiter-error', ...common, at: 1_000_000, waitMs: 0, error });
  });

  it('config-error for an unknown workload, before any wait', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const error = await acquireSlot({
      limiter,
      workload: 'batch' as 'background',
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    expect(error).toMatchObject({
      limiter: 'claude',
      workload: 'batch',
      field: 'workload',
      value: 'batch',
      ...lineage,
    });
    expect(events).toEqual([{ type: 'config-error', ...common, workload: 'batch', at: 1_000_000, error }]);
  });

  it('a listener that throws cannot break the lifecycle', async () => {
    const { clock, limiter } = setup();
    const slot = await acquireSlot({
      limiter,
      clock,
      onEvent: () => {
        throw new Error('bad listener');
      },
    });
    await slot.release();
    expect(limiter.stats().active).toBe(0);
  });

  it('passes the tokens to acquire and the release details to release, and a 429 emits provider-throttled', async () => {
    const { clock, limiter: wrapped, events, onEvent } = setup();
    // As a limiter that takes the release details (the in-memory one's type may not, yet).
    const inner = wrapped as unknown as ConcurrencyLimiter<string>;
    const calls: unknown[][] = [];
    const limiter: ConcurrencyLimiter<string> = {
      name: inner.name,
      acquire: (r) => (calls.push(['acquire', r?.tokens]), inner.acquire(r)),
      renew: (l) => inner.renew(l),
      release: (l, d) => (calls.push(['release', d]), inner.release(l, d)),
    };
    const slot = await acquireSlot({
      limiter,
      workload: 'interactive',
      clock,
      onEvent,
      tokens: { input: 120, output: 800 },
      ...lineage,
    });
    const details = {
      usage: { input: 0, output: 0 },
      provider: { status: 429, retryAfterMs: 2_000, limits: { retryAfterMs: 2_000 } },
    };
    await slot.release('failed', details);
    await slot.release('failed', details); // once only
    expect(calls).toEqual([
      ['acquire', { input: 120, output: 800 }],
      ['release', details],
    ]);
    expect(events.map((e) => e.type)).toEqual(['wait-started', 'acquired', 'provider-throttled', 'released']);
    expect(events[2]).toEqual({
      type: 'provider-throttled',
      ...common,
      at: 1_000_000,
      status: 429,
      retryAfterMs: 2_000,
    });
  });

  it('emits nothing more for a provider that is not overloaded, and calls release with one argument without details', async () => {
    const { clock, limiter: wrapped, onEvent, types } = setup();
    const inner = wrapped as unknown as ConcurrencyLimiter<string>;
    const arities: number[] = [];
    const limiter: ConcurrencyLimiter<string> = {
      name: inner.name,
      acquire: (r) => inner.acquire(r),
      renew: (l) => inner.renew(l),
      release: (...args: Parameters<ConcurrencyLimiter<string>['release']>) => {
        arities.push(args.length);
        return inner.release(...args);
      },
    };
    const first = await acquireSlot({ limiter, clock, onEvent });
    await first.release('completed', { provider: { status: 200, limits: { requests: { remaining: 5 } } } });
    const second = await acquireSlot({ limiter, clock, onEvent });
    await second.release();
    expect(types().filter((t) => t === 'provider-throttled')).toEqual([]);
    expect(arities).toEqual([2, 1]);
  });

  // That the tests of this block emit every event type is known only once they all ran, so it
  // is checked after them, and only when none was filtered out (`-t` running one of them cannot
  // emit them all, and must not fail for it).
  // The hook takes its suite as the second argument; vitest requires the first be destructured.
  // eslint-disable-next-line no-empty-pattern
  afterAll(({}, suite) => {
    if (!suite.tasks.every((task) => task.mode === 'run')) {
      console.warn('[sluice] slot.test.ts: some tests were filtered out; event-type coverage not checked');
      return;
    }
    // `limit-changed` is the limiter's own event (its `subscribe`), which no slot emits: the
    // adaptive limit's tests cover it (adaptive.test.ts).
    const slotTypes = Object.keys(everyType).filter((t) => t !== 'limit-changed');
    expect([...emitted].sort()).toEqual(slotTypes.sort());
  });
});

describe('a budget that ends during the wait', () => {
  /** A limiter that does not honour `timeoutMs`: only acquireSlot's own timer can end the wait. */
  function deaf(inner: ConcurrencyLimiter<string>): ConcurrencyLimiter<string> {
    return { ...faulty(inner, {}), acquire: (r) => inner.acquire({ ...r, timeoutMs: undefined }) };
  }

  it('is a timeout decided by acquireSlot, even when the limiter ignores the budget', async () => {
    const { clock, limiter, events, onEvent } = setup();
    const holder = await acquireSlot({ limiter, clock });
    const controller = new AbortController();
    const pending = acquireSlot({
      limiter: deaf(limiter),
      workload: 'interactive',
      signal: controller.signal,
      timeoutMs: 400,
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    await flush();
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    clock.advance(400);
    const error = await pending;
    expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(error).toMatchObject({ ...common, waitMs: 400, timeoutMs: 400 });
    expect(events.at(-1)).toEqual({ type: 'timed-out', ...common, at: 1_000_400, waitMs: 400 });
    // Nothing left behind: not in the queue, not on the caller's signal.
    expect(limiter.stats()).toMatchObject({ active: 1, queued: 0 });
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
    await holder.release();
  });

  it('is a timeout whichever of the two timers at the same instant fires first', async () => {
    const { clock, limiter, types, onEvent } = setup();
    const holder = await acquireSlot({ limiter, clock });
    // The limiter's own timer (set inside acquire) and acquireSlot's fall due together.
    const pending = acquireSlot({ limiter, timeoutMs: 250, clock, onEvent }).catch((e: unknown) => e);
    clock.advance(250);
    expect(await pending).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(types()).toEqual(['wait-started', 'timed-out']);
    await holder.release();
  });

  it('a cancellation before the budget ends is still a cancellation, and clears the budget timer', async () => {
    const { clock, limiter, types, onEvent } = setup();
    const holder = await acquireSlot({ limiter, clock });
    const controller = new AbortController();
    const before = clock.pendingTimers;
    const pending = acquireSlot({
      limiter: deaf(limiter),
      signal: controller.signal,
      timeoutMs: 400,
      clock,
      onEvent,
    }).catch((e: unknown) => e);
    await flush();
    expect(clock.pendingTimers).toBe(before + 1);
    clock.advance(100);
    const reason = new Error('user left');
    controller.abort(reason);
    expect(await pending).toBe(reason);
    expect(types()).toEqual(['wait-started', 'wait-cancelled']);
    expect(clock.pendingTimers).toBe(before);
    await holder.release();
  });
});
