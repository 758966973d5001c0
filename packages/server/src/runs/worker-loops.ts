import { systemClock, type Clock } from 'sluice/concurrency';
import type { RunClass } from './lifecycle.js';
import type { RunRow } from './store.js';

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

export interface WorkerLoopsOptions {
  /** Executes a run a loop claimed; the loop claims its next run when this settles. */
  execute(run: RunRow): Promise<unknown>;
  log?: Log;
  /** The idle polls and backoffs are timers of this clock (tests drive it by hand). */
  clock?: Clock;
  /** How long an idle loop waits for a notify before it claims again. */
  idlePollMs: number;
  /** The longest backoff of a loop whose claims fail. */
  maxBackoffMs: number;
  /** The first backoff of a loop whose claim failed, doubling from there. Default: idlePollMs. */
  backoffBaseMs?: number;
  /** Backoff jitter in [0, 1): default Math.random. */
  random?: () => number;
  /**
   * Whether any run of the class is queued at all: one short statement a loop woken by its own
   * poll asks before its claim (a transaction of several), so that an idle process's polls are
   * one statement each. A notified or chained loop claims at once. Default: always yes.
   */
  anyQueued?: (runClass: RunClass) => Promise<boolean>;
}

/**
 * The queue workers of one process: loops that each claim a run of their class, execute it,
 * and claim again; with nothing to claim, a loop waits for a notify or its idle poll.
 *
 * A notify wakes loops that are idle at that moment. One that is claiming then (its read
 * taken before the new run committed, so it finds nothing) would miss it and sleep a whole
 * poll with work queued and itself free. So each run of a notify that found no idle loop to
 * wake is kept as a missed run of its class (`#missed`, at most one per loop), and a loop
 * whose claim finds nothing takes one and claims again at once instead of going idle: one
 * claim again per run, not one per loop claiming (at 80 admissions a second and runs that end
 * at once, every loop going round for every run kept the database busy with empty claims).
 * A notify for every class (a thread freed, runs promoted, the workers stopping) is rare: it
 * sends every loop that was claiming meanwhile round again (`#everyClass`).
 *
 * Idle loops of a class do not all poll: one of them (the class's poller) looks every
 * `idlePollMs`, the rest every `idlePollMs * SPARE_POLL_FACTOR`, a fallback only. A notify
 * wakes the spare loops first; when the poller leaves its sleep, another idle loop of its
 * class takes the duty (its timer set to `idlePollMs` from then). Idle, four loops cost two
 * claims a second instead of eight: on the embedded store each claim holds the event loop
 * (PGlite runs on it), and those stalls were the tail of every request the process served.
 */
/** How much longer than the poller a spare idle loop sleeps before it looks on its own. */
export const SPARE_POLL_FACTOR = 10;

interface IdleLoop {
  runClass: RunClass;
  /** Sets its sleep to `ms` from now (the poll duty handed to it). */
  rearm(ms: number): void;
  /** Wakes it as its poll would: a poll found work, this one looks for more. */
  chain(): void;
}

export class WorkerLoops {
  /** Idle loops (their wake functions), each with the class of run it claims. */
  readonly #idle = new Map<() => void, IdleLoop>();
  /** The idle loop of each class that looks every idlePollMs. */
  readonly #poller = new Map<RunClass, () => void>();
  /** Loops waiting out a database failure; woken only to stop. */
  readonly #backingOff = new Set<() => void>();
  readonly #loops: Promise<void>[] = [];
  /** Runs of each class notified while no idle loop was left to wake for them. */
  readonly #missed = new Map<RunClass, number>();
  /** Loops of each class (the most missed runs worth keeping). */
  readonly #count = new Map<RunClass, number>();
  /** Notifies for every class so far. */
  #everyClass = 0;
  #claiming = false;
  readonly #options: WorkerLoopsOptions;
  readonly #clock: Clock;

  constructor(options: WorkerLoopsOptions) {
    this.#options = options;
    this.#clock = options.clock ?? systemClock;
  }

  /** Loops idle now (waiting for a notify or their poll), for tests and metrics. */
  get idle(): number {
    return this.#idle.size;
  }

  /**
   * Queued runs were written: wake idle workers now instead of at their next poll. Given a
   * class, one idle loop of that class is woken per run: a loop that wakes for nothing costs a
   * transaction, and a burst of admissions must not make every worker claim in vain. Runs left
   * without a woken loop are kept for the loops claiming now. Without a class (a thread freed,
   * scheduled runs promoted, the workers stopping), every idle loop wakes and every claiming
   * loop claims again.
   */
  notify(runClass?: RunClass, runs = 1): void {
    let left = runs;
    // Spare loops first: the poller keeps its rhythm while there are others to wake.
    const pollers = new Set(this.#poller.values());
    const idle = [...this.#idle].sort(([a], [b]) => Number(pollers.has(a)) - Number(pollers.has(b)));
    for (const [wake, loop] of idle) {
      if (runClass !== undefined && (loop.runClass !== runClass || left <= 0)) continue;
      left--;
      wake();
    }
    if (runClass === undefined) this.#everyClass++;
    else if (left > 0) {
      const kept = (this.#missed.get(runClass) ?? 0) + left;
      this.#missed.set(runClass, Math.min(kept, this.#count.get(runClass) ?? 0));
    }
  }

  /** The poller of `runClass` left its sleep: another idle loop of the class polls from now. */
  #handPollOn(runClass: RunClass): void {
    this.#poller.delete(runClass);
    for (const [wake, loop] of this.#idle) {
      if (loop.runClass !== runClass) continue;
      this.#poller.set(runClass, wake);
      loop.rearm(this.#options.idlePollMs);
      return;
    }
  }

  /** Wakes one idle loop of the class as a poll would (a spare before the poller), if one is idle. */
  #chainOne(runClass: RunClass): void {
    const poller = this.#poller.get(runClass);
    let chosen: IdleLoop | undefined;
    for (const [wake, loop] of this.#idle) {
      if (loop.runClass !== runClass) continue;
      chosen = loop;
      if (wake !== poller) break;
    }
    chosen?.chain();
  }

  /** Takes one missed run of the class, if there is one. */
  #takeMissed(runClass: RunClass): boolean {
    const missed = this.#missed.get(runClass) ?? 0;
    if (missed === 0) return false;
    this.#missed.set(runClass, missed - 1);
    return true;
  }

  /** Starts `count` loops claiming runs of `runClass` with `claim`. */
  start(runClass: RunClass, count: number, claim: () => Promise<RunRow | undefined>): void {
    this.#claiming = true;
    this.#count.set(runClass, (this.#count.get(runClass) ?? 0) + count);
    for (let i = 0; i < count; i++) this.#loops.push(this.#loop(runClass, claim));
  }

  /** Claim nothing more; resolves when every loop has ended (after its current run). */
  async stop(): Promise<void> {
    this.#claiming = false;
    this.notify();
    for (const wake of [...this.#backingOff]) wake();
    await Promise.allSettled(this.#loops.splice(0));
  }

  async #loop(runClass: RunClass, claim: () => Promise<RunRow | undefined>): Promise<void> {
    const { idlePollMs, maxBackoffMs } = this.#options;
    const backoffBaseMs = this.#options.backoffBaseMs ?? idlePollMs;
    const random = this.#options.random ?? Math.random;
    let failures = 0;
    // Woken by a poll (its own, or a chain from one), not by a notify.
    let polled = false;
    // Woken by its own poll's timer: nothing told it of work.
    let timedOut = false;
    const anyQueued = this.#options.anyQueued;
    while (this.#claiming) {
      const everyClass = this.#everyClass;
      let run: RunRow | undefined;
      try {
        const look = timedOut && anyQueued !== undefined ? await anyQueued(runClass) : true;
        timedOut = false;
        run = look ? await claim() : undefined;
        failures = 0;
      } catch (error) {
        // The database is away: back off (with jitter, so a hundred loops do not knock on a
        // recovering server at once), then try again. The loop itself never ends on an error.
        if (failures++ === 0)
          this.#options.log?.('warn', 'claiming a queued run failed', { error: String(error) });
      }
      if (run) {
        // Found by a poll: queued where no notify reached this process (a peer admitted or
        // promoted it), maybe with more behind it. One more idle loop looks at once, and so
        // on while looks find runs: a burst is taken in one round, not one run a poll.
        if (polled) this.#chainOne(runClass);
        polled = false;
        await this.#options.execute(run).catch(() => undefined);
        continue;
      }
      // Stopped while claiming: end now rather than after a poll.
      if (!this.#claiming) break;
      // A run queued while this claim was reading, with no idle loop to wake: claim again now.
      if (failures === 0 && (this.#everyClass !== everyClass || this.#takeMissed(runClass))) continue;
      const pause =
        failures === 0
          ? idlePollMs
          : Math.min(backoffBaseMs * 2 ** failures, maxBackoffMs) * (0.5 + random() / 2);
      polled = false;
      await new Promise<void>((resolve) => {
        let timer: ReturnType<Clock['setTimeout']> | undefined;
        const poll = () => {
          polled = true;
          wake();
        };
        const wake = () => {
          if (timer !== undefined) this.#clock.clearTimeout(timer);
          this.#idle.delete(wake);
          this.#backingOff.delete(wake);
          if (this.#poller.get(runClass) === wake) this.#handPollOn(runClass);
          resolve();
        };
        if (failures > 0) {
          // A failing loop keeps its backoff, whatever notifies come.
          this.#backingOff.add(wake);
          timer = this.#clock.setTimeout(wake, pause);
          return;
        }
        const polls = !this.#poller.has(runClass);
        if (polls) this.#poller.set(runClass, wake);
        const pollTimedOut = () => {
          timedOut = true;
          poll();
        };
        timer = this.#clock.setTimeout(pollTimedOut, polls ? pause : pause * SPARE_POLL_FACTOR);
        this.#idle.set(wake, {
          runClass,
          rearm: (ms) => {
            if (timer !== undefined) this.#clock.clearTimeout(timer);
            timer = this.#clock.setTimeout(pollTimedOut, ms);
          },
          chain: poll,
        });
      });
    }
  }
}
