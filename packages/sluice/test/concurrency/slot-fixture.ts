// What the slot tests share: a limiter with two workloads on a ManualClock, a limiter that
// fails on command, and the lineage every event and error should carry.
import {
  ManualClock,
  createConcurrencyLimiter,
  type ConcurrencyEvent,
  type ConcurrencyEventType,
  type ConcurrencyLimiter,
} from 'sluice/concurrency';

export const lineage = { runId: 'run-2', rootRunId: 'run-1', parentRunId: 'run-1', requestId: 'req-9' };

/** The event types the tests of the importing file made acquireSlot emit. */
export const emitted = new Set<ConcurrencyEventType>();

export function setup(options: { maxConcurrent?: number; maxQueued?: number; leaseTtlMs?: number } = {}) {
  const clock = new ManualClock(1_000_000);
  const limiter = createConcurrencyLimiter({
    name: 'claude',
    maxConcurrent: options.maxConcurrent ?? 1,
    maxQueued: options.maxQueued,
    leaseTtlMs: options.leaseTtlMs ?? 3000,
    clock,
    workloads: { interactive: { reserved: 0, priority: 10 }, background: {} },
    defaultWorkload: 'background',
  });
  const events: ConcurrencyEvent[] = [];
  const onEvent = (e: ConcurrencyEvent) => {
    emitted.add(e.type);
    events.push(e);
  };
  return { clock, limiter, events, onEvent, types: () => events.map((e) => e.type) };
}

/** A limiter that fails on command, around a real one. */
export function faulty(
  inner: ConcurrencyLimiter<string>,
  faults: { acquire?: Error; renew?: Error; release?: Error },
) {
  const limiter: ConcurrencyLimiter<string> = {
    name: inner.name,
    acquire: (r) => (faults.acquire ? Promise.reject(faults.acquire) : inner.acquire(r)),
    renew: (l) => (faults.renew ? Promise.reject(faults.renew) : inner.renew(l)),
    release: (l) => (faults.release ? Promise.reject(faults.release) : inner.release(l)),
  };
  return limiter;
}

export const common = {
  limiter: 'claude',
  workload: 'interactive',
  ...lineage,
};
