import { getEventListeners } from 'node:events';
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  ManualClock,
  createConcurrencyLimiter,
} from 'sluice/concurrency';

function track<T>(promise: Promise<T>) {
  const state: { settled: boolean; value?: T; error?: unknown } = { settled: false };
  promise.then(
    (value) => Object.assign(state, { settled: true, value }),
    (error: unknown) => Object.assign(state, { settled: true, error }),
  );
  return state;
}

describe('in-memory limiter, on a manual clock', () => {
  it('hands an expired lease to the next waiter exactly at its expiry', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, leaseTtlMs: 1000, clock });
    const a = await limiter.acquire();
    expect(a.expiresAt - a.acquiredAt).toBe(1000);
    const b = track(limiter.acquire());
    clock.advance(999);
    await flush();
    expect(b.settled).toBe(false);
    clock.advance(1);
    await flush();
    expect(b.value?.acquiredAt).toBe(a.acquiredAt + 1000);
    expect(await limiter.renew(a)).toBeUndefined();
    await limiter.release(b.value!);
    clock.advance(1000);
    expect(clock.pendingTimers).toBe(0);
  });

  it('renewal moves the expiry; the lease then outlives its first ttl', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, leaseTtlMs: 1000, clock });
    let lease = await limiter.acquire();
    const waiter = track(limiter.acquire());
    for (let i = 0; i < 5; i++) {
      clock.advance(600);
      const renewed = await limiter.renew(lease);
      expect(renewed?.expiresAt).toBe(clock.now() + 1000);
      lease = renewed!;
    }
    await flush();
    expect(waiter.settled).toBe(false);
    expect(limiter.stats()).toMatchObject({ active: 1, queued: 1 });
    await limiter.release(lease);
    await flush();
    expect(waiter.value).toBeDefined();
    await limiter.release(waiter.value!);
  });

  it('ends a wait at the smaller of maxWaitMs and the caller budget, and leaves no listener behind', async () => {
    const clock = new ManualClock();
    const limiter = createConcurrencyLimiter({
      maxConcurrent: 1,
      clock,
      workloads: { web: { maxWaitMs: 5000 } },
    });
    const holder = await limiter.acquire();
    const controller = new AbortController();
    const byBudget = track(limiter.acquire({ timeoutMs: 300, signal: controller.signal }));
    const byMaxWait = track(limiter.acquire({ timeoutMs: 60_000 }));
    clock.advance(300);
    await flush();
    expect(byBudget.error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(byBudget.error).toMatchObject({
      waitMs: 300,
      timeoutMs: 300,
      workload: 'web',
      limiter: 'default',
    });
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
    expect(byMaxWait.settled).toBe(false);
    clock.advance(4700);
    await flush();
    expect(byMaxWait.error).toMatchObject({ waitMs: 5000, timeoutMs: 5000 });
    expect(limiter.stats().queued).toBe(0);
    await limiter.release(holder);
  });

  it('refuses at once a caller whose budget is spent, even with a free slot', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 2 });
    await expect(limiter.acquire({ timeoutMs: 0 })).rejects.toMatchObject({
      name: 'ConcurrencyTimeoutError',
      waitMs: 0,
      timeoutMs: 0,
    });
    expect(limiter.stats().active).toBe(0);
  });

  it('with maxWaitMs 0, takes a free slot but never waits', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, workloads: { now: { maxWaitMs: 0 } } });
    const lease = await limiter.acquire();
    await expect(limiter.acquire()).rejects.toBeInstanceOf(ConcurrencyTimeoutError);
    await limiter.release(lease);
  });

  it('with maxQueued 0, never queues', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, maxQueued: 0 });
    const lease = await limiter.acquire();
    await expect(limiter.acquire()).rejects.toMatchObject({
      name: 'ConcurrencyQueueFullError',
      maxQueued: 0,
      queued: 0,
    });
    await limiter.release(lease);
  });

  it('removes the abort listener when a waiter is granted', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const holder = await limiter.acquire();
    const controller = new AbortController();
    const waiter = limiter.acquire({ signal: controller.signal });
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    await limiter.release(holder);
    await limiter.release(await waiter);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
  });

  it('keeps arrival order and cheap removal with 20,000 waiters', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, workloads: { a: {}, b: { priority: 1 } } });
    let holder = await limiter.acquire({ workload: 'a' });
    const order: number[] = [];
    const controllers: AbortController[] = [];
    const waiters = Array.from({ length: 20_000 }, (_, i) => {
      const controller = new AbortController();
      controllers.push(controller);
      return limiter.acquire({ workload: i % 2 ? 'b' : 'a', signal: controller.signal }).then(
        (lease) => (order.push(i), lease),
        () => undefined,
      );
    });
    // Cancel every third one, wherever it sits in the queue.
    for (let i = 0; i < controllers.length; i += 3) controllers[i]!.abort(new Error('gone'));
    expect(limiter.stats().queued).toBe(20_000 - Math.ceil(20_000 / 3));
    for (let i = 0; i < waiters.length; i++) {
      await limiter.release(holder);
      await flush();
      const next = order.length;
      if (next === 0) break;
      holder = (await waiters[order[next - 1]!])!;
      if (limiter.stats().queued === 0) break;
    }
    await limiter.release(holder);
    const kept = Array.from({ length: 20_000 }, (_, i) => i).filter((i) => i % 3 !== 0);
    // Workload b has the higher priority: all of b in arrival order, then all of a.
    expect(order).toEqual([...kept.filter((i) => i % 2), ...kept.filter((i) => i % 2 === 0)]);
  });

  it('rejects overflow with the counts in the error', async () => {
    const limiter = createConcurrencyLimiter({ name: 'claude', maxConcurrent: 1, maxQueued: 1 });
    const holder = await limiter.acquire({ runId: 'r' });
    const waiting = limiter.acquire();
    const error = await limiter.acquire({ runId: 'r2', requestId: 'q2' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyQueueFullError);
    expect(error).toMatchObject({
      limiter: 'claude',
      workload: 'default',
      runId: 'r2',
      requestId: 'q2',
      maxQueued: 1,
      queued: 1,
    });
    expect((error as Error).message).toBe(
      'Queue of limiter `claude` is full: 1 requests waiting, maxQueued is 1',
    );
    await limiter.release(holder);
    await limiter.release(await waiting);
  });
});
