import { ManualClock, type ClockTimer } from 'sluice/concurrency';
import { afterEach, expect, it } from 'vitest';
import type { RunClass } from '../../src/runs/lifecycle.js';
import type { RunRow } from '../../src/runs/store.js';
import { SPARE_POLL_FACTOR, WorkerLoops } from '../../src/runs/worker-loops.js';
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

function start(
  loopsByClass: [RunClass, number, Claims][],
  timing: { idlePollMs?: number; backoffBaseMs?: number } = {},
) {
  const clock = new WatchedClock();
  const executed: string[] = [];
  const loops = new WorkerLoops({
    execute: async (run) => void executed.push(run.id),
    clock,
    idlePollMs: IDLE_POLL_MS,
    maxBackoffMs: 10_000,
    random: () => 0.5,
    ...timing,
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
  // The first to find nothing claims again; the two after it go to sleep: the first of them
  // as the class's poller, the second as a spare.
  const first = nextMove(claims, clock);
  claims.calls[0]!.resolve(undefined);
  expect(await first).toBe('claimed');
  const sleeps = [];
  for (const call of [claims.calls[1]!, claims.calls[2]!]) {
    const move = nextMove(claims, clock);
    call.resolve(undefined);
    sleeps.push(await move);
  }
  expect(sleeps).toEqual([`slept ${IDLE_POLL_MS} ms`, `slept ${IDLE_POLL_MS * SPARE_POLL_FACTOR} ms`]);
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

it('with idle polls far apart (the embedded store), a failed claim still backs off from the shared pace', async () => {
  const claims = new Claims();
  const { loops, clock } = start([['deferred', 1, claims]], {
    idlePollMs: IDLE_POLL_MS * 10,
    backoffBaseMs: IDLE_POLL_MS,
  });
  expect(loops.idle).toBe(0);
  const backoff = nextMove(claims, clock);
  claims.calls[0]!.reject(new Error('database away'));
  expect(await backoff).toBe(`slept ${IDLE_POLL_MS * 2 * 0.75} ms`);
  // Then the claim again, which finds nothing: the loop sleeps the long idle poll.
  const claimed = claims.nextClaim();
  clock.advance(IDLE_POLL_MS * 2 * 0.75);
  await claimed;
  const slept = clock.nextSleep();
  claims.calls[1]!.resolve(undefined);
  expect(await slept).toBe(IDLE_POLL_MS * 10);
});

/** Starts `count` loops of one class and lets each claim find nothing: all idle. */
async function allIdle(count: number) {
  const claims = new Claims();
  const started = start([['default', count, claims]]);
  for (const call of [...claims.calls]) {
    const slept = started.clock.nextSleep();
    call.resolve(undefined);
    await slept;
  }
  expect(started.loops.idle).toBe(count);
  return { ...started, claims };
}

it('of four idle loops one polls every idlePollMs; the others wait ten times as long', async () => {
  const { clock, claims } = await allIdle(4);
  expect(claims.calls).toHaveLength(4);
  // Each poll: one claim, which finds nothing, and the duty has passed to another idle loop.
  for (let poll = 1; poll <= 9; poll++) {
    const claimed = claims.nextClaim();
    clock.advance(IDLE_POLL_MS);
    await claimed;
    expect(claims.calls).toHaveLength(4 + poll);
    const slept = clock.nextSleep();
    claims.calls.at(-1)!.resolve(undefined);
    await slept;
  }
  // Nine polls in 4.5 s: nine claims, not the 36 of four loops each polling.
  expect(claims.calls).toHaveLength(13);
});

it('a notify wakes a spare loop, not the poller, whose poll keeps its time', async () => {
  const { loops, clock, claims, executed } = await allIdle(3);
  /** Whether a loop claims before the next turn of the event loop. */
  const claimsNow = () =>
    Promise.race([
      claims.nextClaim().then(() => true),
      new Promise<boolean>((resolve) => setImmediate(() => resolve(false))),
    ]);
  clock.advance(IDLE_POLL_MS - 100);
  const woken = claims.nextClaim();
  loops.notify('default', 1);
  await woken;
  const slept = clock.nextSleep();
  claims.calls.at(-1)!.resolve(row('run_1'));
  await claims.nextClaim();
  claims.calls.at(-1)!.resolve(undefined);
  expect(await slept).toBe(IDLE_POLL_MS * SPARE_POLL_FACTOR);
  expect(executed).toEqual(['run_1']);
  // The poller was left asleep: it polls on time. (Had the notify woken it, the duty would
  // have passed to a spare with a full idlePollMs from the notify: no claim now.)
  const polled = claimsNow();
  clock.advance(100);
  expect(await polled).toBe(true);
});

it('runs queued where no notify reaches (a peer admitted them) are taken in one poll, one loop chaining the next', async () => {
  const clock = new ManualClock();
  const queue: string[] = [];
  const claimedAt: number[] = [];
  const t0 = clock.now();
  const loops = new WorkerLoops({
    // Runs that take long: a loop that took one stays busy for the whole test.
    execute: () => new Promise(() => undefined),
    clock,
    idlePollMs: IDLE_POLL_MS,
    maxBackoffMs: 10_000,
  });
  stops.push(async () => {
    // Busy loops never end here; stop only the idle ones' timers.
    void loops.stop();
  });
  const turns = async () => {
    for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
  };
  loops.start('default', 5, async () => {
    const id = queue.shift();
    if (id) claimedAt.push(clock.now() - t0);
    return id ? row(id) : undefined;
  });
  await turns();
  expect(loops.idle).toBe(5);
  queue.push('r1', 'r2', 'r3', 'r4');
  clock.advance(IDLE_POLL_MS);
  await turns();
  // All four at the first poll (one loop a poll would take 2 s), and one loop left idle.
  expect(claimedAt).toEqual([IDLE_POLL_MS, IDLE_POLL_MS, IDLE_POLL_MS, IDLE_POLL_MS]);
  expect(loops.idle).toBe(1);
});

it('a loop woken by its own poll asks whether any run is queued before it claims; a notified loop claims at once', async () => {
  const clock = new WatchedClock();
  const claims = new Claims();
  const asked: RunClass[] = [];
  let answer: boolean | Error = false;
  const loops = new WorkerLoops({
    execute: async () => undefined,
    clock,
    idlePollMs: IDLE_POLL_MS,
    maxBackoffMs: 10_000,
    random: () => 0.5,
    anyQueued: async (runClass) => {
      asked.push(runClass);
      if (answer instanceof Error) throw answer;
      return answer;
    },
  });
  stops.push(async () => {
    const stopped = loops.stop();
    for (const call of claims.calls) call.resolve(undefined);
    await stopped;
  });
  loops.start('deferred', 1, claims.claim);
  // Its first claim, at start, asks nothing first.
  expect(claims.calls).toHaveLength(1);
  let slept = clock.nextSleep();
  claims.calls[0]!.resolve(undefined);
  expect(await slept).toBe(IDLE_POLL_MS);

  // Its poll: nothing queued, so no claim's transaction, and back to sleep.
  slept = clock.nextSleep();
  clock.advance(IDLE_POLL_MS);
  expect(await slept).toBe(IDLE_POLL_MS);
  expect(asked).toEqual(['deferred']);
  expect(claims.calls).toHaveLength(1);

  // The next poll finds a run queued (by a peer, say): it claims.
  answer = true;
  let claimed = claims.nextClaim();
  clock.advance(IDLE_POLL_MS);
  await claimed;
  expect(asked).toEqual(['deferred', 'deferred']);
  slept = clock.nextSleep();
  claims.calls[1]!.resolve(undefined);
  await slept;

  // A notify means a run was queued here: the loop claims without asking.
  answer = false;
  claimed = claims.nextClaim();
  loops.notify('deferred', 1);
  await claimed;
  expect(asked).toHaveLength(2);
  slept = clock.nextSleep();
  claims.calls[2]!.resolve(undefined);
  await slept;

  // A question that fails is a failed claim: the loop backs off (1,000 ms with its jitter at 0.5).
  answer = new Error('the database is away');
  slept = clock.nextSleep();
  clock.advance(IDLE_POLL_MS);
  expect(await slept).toBe(750);
  expect(claims.calls).toHaveLength(3);
});

it('a loop chained by a poll that found a run claims without asking; the polling loop asked once', async () => {
  const clock = new WatchedClock();
  const claims = new Claims();
  const asked: RunClass[] = [];
  const executed: string[] = [];
  const loops = new WorkerLoops({
    execute: async (run) => void executed.push(run.id),
    clock,
    idlePollMs: IDLE_POLL_MS,
    maxBackoffMs: 10_000,
    random: () => 0.5,
    anyQueued: async (runClass) => {
      asked.push(runClass);
      return true;
    },
  });
  stops.push(async () => {
    const stopped = loops.stop();
    for (const call of claims.calls) call.resolve(undefined);
    await stopped;
  });
  loops.start('default', 2, claims.claim);
  for (const call of [...claims.calls]) {
    const slept = clock.nextSleep();
    call.resolve(undefined);
    await slept;
  }
  // The poller's timer: it asks, claims and finds a run (queued by a peer)...
  let claimed = claims.nextClaim();
  clock.advance(IDLE_POLL_MS);
  await claimed;
  expect(asked).toEqual(['default']);
  // ...so the other loop is woken to look for more: it claims at once, without asking.
  claimed = claims.nextClaim();
  claims.calls[2]!.resolve(row('run_1'));
  await claimed;
  expect(asked).toEqual(['default']);
  expect(claims.calls).toHaveLength(4);
  expect(executed).toEqual(['run_1']);
});
