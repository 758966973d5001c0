import { ManualClock } from 'sluice/concurrency';
import { afterEach, expect, it } from 'vitest';
import { PromotionPasses } from '../../src/node/promotion.js';
import { deferred, type Deferred } from '../harness/deferred.js';

/**
 * When the promotion passes come, on a manual clock: each pass is a deferred the test settles
 * with whether any run still waits for its time.
 */
const BUSY_MS = 250;
const IDLE_MS = 2000;

function passes() {
  const clock = new ManualClock();
  const calls: Deferred<boolean>[] = [];
  const startedAt: number[] = [];
  const p = new PromotionPasses(
    () => {
      const call = deferred<boolean>();
      calls.push(call);
      startedAt.push(clock.now() - t0);
      return call.promise;
    },
    clock,
    BUSY_MS,
    IDLE_MS,
  );
  const t0 = clock.now();
  stops.push(() => p.stop());
  p.start();
  /** Settles the pass under way and lets its continuation plan the next. */
  const settle = async (waiting: boolean) => {
    calls.at(-1)!.resolve(waiting);
    await new Promise((resolve) => setImmediate(resolve));
  };
  return { p, clock, calls, startedAt, settle };
}

const stops: (() => void)[] = [];
afterEach(() => {
  for (const stop of stops.splice(0)) stop();
});

it('passes come every busyMs while runs wait, every idleMs once none does', async () => {
  const { clock, startedAt, settle } = passes();
  clock.advance(BUSY_MS);
  await settle(true);
  clock.advance(BUSY_MS);
  await settle(false);
  clock.advance(BUSY_MS);
  expect(startedAt).toEqual([BUSY_MS, 2 * BUSY_MS]);
  clock.advance(IDLE_MS - BUSY_MS);
  expect(startedAt).toEqual([BUSY_MS, 2 * BUSY_MS, 2 * BUSY_MS + IDLE_MS]);
});

it('a run scheduled here while idle brings the next pass forward to busyMs', async () => {
  const { p, clock, startedAt, settle } = passes();
  clock.advance(BUSY_MS);
  await settle(false);
  clock.advance(100);
  p.scheduled();
  clock.advance(BUSY_MS);
  expect(startedAt).toEqual([BUSY_MS, BUSY_MS + 100 + BUSY_MS]);
});

it('a run scheduled during a pass that saw none waiting: the pass after still comes at busyMs', async () => {
  const { p, clock, startedAt, settle } = passes();
  clock.advance(BUSY_MS);
  // The pass read the table before the run was written, and says none waits.
  p.scheduled();
  await settle(false);
  clock.advance(BUSY_MS);
  expect(startedAt).toEqual([BUSY_MS, 2 * BUSY_MS]);
});

it('stops: no pass after stop, even when one was under way', async () => {
  const { p, clock, startedAt, settle } = passes();
  clock.advance(BUSY_MS);
  p.stop();
  await settle(true);
  clock.advance(10 * IDLE_MS);
  expect(startedAt).toEqual([BUSY_MS]);
  expect(clock.pendingTimers).toBe(0);
});
