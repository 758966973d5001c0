import { ManualClock, type ClockTimer } from 'sluice/concurrency';
import { afterEach, expect, it } from 'vitest';
import type { RunClass } from '../../src/runs/lifecycle.js';
import type { RunRow } from '../../src/runs/store.js';
import { WorkerLoops } from '../../src/runs/worker-loops.js';
import { deferred, type Deferred } from '../harness/deferred.js';

/**
 * The queue workers' loops, with claims the test answers by hand and a manual clock: nothing
 * here waits for time, so an idle poll never fires unless a test advances the clock. Each
 * step waits for the loop's next move: a claim, or a timer set (it went idle).
 */

const IDLE_POLL_MS = 500;

/** A manual clock that tells when a timer is set (a loop went to sleep). */
class WatchedClock extends ManualClock {
  #slept = deferred<number>();
  override setTimeout(callback: () => void, ms: number): ClockTimer {
    const timer = super.setTimeout(callback, ms);
    this.#slept.resolve(ms);
    return timer;
  }
  /** Resolves with the timer's length the next time a loop sleeps. */
  nextSleep(): Promise<number> {
    this.#slept = deferred<number>();
    return this.#slept.promise;
  }
}

/** Claims answered by the test, one deferred per call, in order. */
class Claims {
  readonly calls: Deferred<RunRow | undefined>[] = [];
  #next = deferred();
  claim = (): Promise<RunRow | undefined> => {
    const call = deferred<RunRow | undefined>();
    this.calls.push(call);
    this.#next.resolve();
    return call.promise;
  };
  /** Resolves the next time a loop claims. */
  nextClaim(): Promise<void> {
    this.#next = deferred();
    return this.#next.promise;
  }
}

const stops: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const stop of stops.splice(0)) await stop();
});

function start(loopsByClass: [RunClass, number, Claims][]) {
  const clock = new WatchedClock();
  const executed: string[] = [];
  const loops = new WorkerLoops({
    execute: async (run) => void executed.push(run.id),
    clock,
    idlePollMs: IDLE_POLL_MS,
    maxBackoffMs: 10_000,
    random: () => 0.5,
  });
  stops.push(async () => {
    const stopped = loops.stop();
    // Loops still claiming end once their claim is answered.
    for (const [, , claims] of loopsByClass) for (const call of claims.calls) call.resolve(undefined);
    await stopped;
  });
  for (const [runClass, count, claims] of loopsByClass) loops.start(runClass, count, claims.claim);
  return { loops, clock, executed };
}

/** What the loops do next: claim again, or go to sleep (with the timer's length). */
const nextMove = (claims: Claims, clock: WatchedClock) =>
  Promise.race([
    claims.nextClaim().then(() => 'claimed' as const),
    clock.nextSleep().then((ms) => `slept ${ms} ms` as const),
  ]);

const row = (id: string) => ({ id }) as RunRow;

it('a notify that comes while the only loop is claiming makes it claim again at once, not after its poll', async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 1, claims]]);
  expect(claims.calls).toHaveLength(1);
  // The run is queued (and notified) while the claim's read is under way: the read missed it.
  loops.notify('deferred');
  const move = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  expect(await move).toBe('claimed');
  expect(claims.calls).toHaveLength(2);
  expect(clock.pendingTimers).toBe(0);
});

it('a claim that finds nothing with no notify meanwhile sleeps its poll, and a notify then wakes it', async () => {
  const claims = new Claims();
  const { loops, clock, executed } = start([['deferred', 1, claims]]);
  const slept = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  expect(await slept).toBe(`slept ${IDLE_POLL_MS} ms`);
  expect(loops.idle).toBe(1);
  const woke = claims.nextClaim();
  loops.notify('deferred');
  await woke;
  expect(loops.idle).toBe(0);
  expect(clock.pendingTimers).toBe(0);
  // A run found is executed, then the loop claims again without sleeping.
  const again = nextMove(claims, clock);
  claims.calls[1]!.resolve(row('run_a'));
  expect(await again).toBe('claimed');
  expect(executed).toEqual(['run_a']);
});

it('a notify that woke an idle loop for its run does not send a claiming loop round again', async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 2, claims]]);
  expect(claims.calls).toHaveLength(2);
  // The first loop finds nothing and goes idle; the second is still claiming.
  const slept = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  expect(await slept).toBe(`slept ${IDLE_POLL_MS} ms`);
  // One run: the idle loop is woken for it, and claims.
  const woke = claims.nextClaim();
  loops.notify('deferred', 1);
  await woke;
  expect(claims.calls).toHaveLength(3);
  // The loop that was claiming throughout finds nothing (the woken one takes the run): it sleeps.
  const second = nextMove(claims, clock);
  claims.calls[1]!.resolve(undefined);
  expect(await second).toBe(`slept ${IDLE_POLL_MS} ms`);
  expect(claims.calls).toHaveLength(3);
});

it('two runs, one idle loop: the run left over sends the claiming loop round again', async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 2, claims]]);
  const slept = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  await slept;
  const woke = claims.nextClaim();
  loops.notify('deferred', 2);
  await woke;
  const second = nextMove(claims, clock);
  claims.calls[1]!.resolve(undefined);
  expect(await second).toBe('claimed');
  expect(claims.calls).toHaveLength(4);
});

it('one run queued while three loops claim sends one of them round again, not all three', async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 3, claims]]);
  expect(claims.calls).toHaveLength(3);
  loops.notify('deferred', 1);
  // The first to find nothing claims again; the two after it go to sleep.
  const first = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  expect(await first).toBe('claimed');
  for (const call of [claims.calls[1]!, claims.calls[2]!]) {
    const move = nextMove(claims, clock);
    call.resolve(undefined);
    expect(await move).toBe(`slept ${IDLE_POLL_MS} ms`);
  }
  expect(claims.calls).toHaveLength(4);
  expect(loops.idle).toBe(2);
});

it("another class's run does not send a claiming loop round again; a notify for every class does", async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 1, claims]]);
  loops.notify('default');
  const slept = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  expect(await slept).toBe(`slept ${IDLE_POLL_MS} ms`);
  // Woken by the poll this time (the clock moved), then a thread is freed during its claim.
  const polled = claims.nextClaim();
  clock.advance(IDLE_POLL_MS);
  await polled;
  loops.notify();
  const again = nextMove(claims, clock);
  claims.calls[1]!.resolve(undefined);
  expect(await again).toBe('claimed');
});

it('a failing claim backs off however many notifies come, and stop wakes it', async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 1, claims]]);
  loops.notify('deferred');
  const backoff = nextMove(claims, clock);
  claims.calls[0]!.reject(new Error('database away'));
  // The first failure: twice the poll, times 0.5 + random / 2 (0.75 here).
  expect(await backoff).toBe(`slept ${IDLE_POLL_MS * 2 * 0.75} ms`);
  loops.notify('deferred');
  expect(loops.idle).toBe(0);
  expect(claims.calls).toHaveLength(1);
  await stops.shift()!();
  expect(claims.calls).toHaveLength(1);
});
