import { randomBytes } from 'node:crypto';
import type { Database } from '@sluice/postgres/database';
import type { ConcurrencyEventListener } from 'sluice';
import { systemClock, type Clock } from 'sluice/concurrency';
import type { SluiceConfig } from '../config.js';
import { checkClasses } from '../config.js';
import type { ServerSettings } from '../settings.js';
import { tuning } from '../tuning.js';
import type { RunClass } from './lifecycle.js';
import type { RunEvents } from './events.js';
import { threadLeaseMs } from '../threads/store.js';
import { anyQueued, claimDefaultRun, claimDeferredRun } from './claims.js';
import { RunExecution, StopSignal, type RunListener, type StopReason } from './run-execution.js';
import { runsToStop, type RunRow } from './store.js';
import type { RunWaiters } from './waiters.js';
import { WorkerLoops } from './worker-loops.js';
import { RunStreams } from '../streams/index.js';
import { EarlyStart } from './early-start.js';

export type { RunListener } from './run-execution.js';

interface LocalRun {
  readonly controller: AbortController;
  readonly done: Promise<RunRow | undefined>;
}

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

const { watchMs: WATCH_MS, idlePollMs: IDLE_POLL_MS, maxClaimBackoffMs: MAX_BACKOFF_MS } = tuning;

/**
 * Runs agents for this process: inline runs on the request that carried them, queued runs on
 * workers that claim the oldest queued run of their class. Keeps the abort handle of every run
 * executing here, stops one when a cancel arrives from any process, and stops runs that are no
 * longer its own (a peer declared them lost), so nothing keeps spending after that.
 */
export class Executor {
  readonly node = `node_${randomBytes(6).toString('hex')}`;
  readonly #running = new Map<string, LocalRun>();
  /** Runs started before their admission answered, until a front executes them or they are refused. */
  readonly #early = new Map<string, { start: EarlyStart; done: Promise<RunRow | undefined> }>();
  /** The queue workers (./worker-loops.ts). */
  readonly #workers: WorkerLoops;
  /** How one run executes (./run-execution.ts). */
  readonly #execution: RunExecution;
  #pastDeadline = false;
  #claimsHeldBack = 0;
  #watch: ReturnType<typeof setInterval> | undefined;
  #watching = false;
  /** Hear the slot events of every run executed here (metrics); a listener that throws is ignored. */
  readonly concurrencyListeners = new Set<ConcurrencyEventListener>();
  /** The stored events of every run executed (and admitted) here. */
  readonly streams: RunStreams;
  readonly #onConcurrency: ConcurrencyEventListener = (event) => {
    for (const listener of this.concurrencyListeners) {
      try {
        listener(event);
      } catch {
        // one broken listener must not keep the others from hearing the event
      }
    }
  };

  constructor(
    private readonly db: Database,
    private readonly config: SluiceConfig,
    private readonly settings: ServerSettings,
    private readonly waiters: RunWaiters,
    events: RunEvents,
    private readonly log: Log = () => undefined,
    private readonly clock: Clock = systemClock,
    options: { storeEvents?: boolean; idlePollMs?: number } = {},
  ) {
    // A config built without defineConfig is checked here, before any worker starts.
    checkClasses(config);
    this.streams = new RunStreams(db, events, clock, (message, fields) => log('warn', message, fields), {
      store: options.storeEvents ?? true,
    });
    this.#execution = new RunExecution({
      db,
      config,
      settings,
      streams: this.streams,
      log,
      clock,
      node: this.node,
      onConcurrency: this.#onConcurrency,
    });
    // The loops' polls are Node's timers whatever the app's clock: a test's manual clock must
    // not stop the workers from ever looking again.
    this.#workers = new WorkerLoops({
      execute: (run) => this.execute(run),
      log,
      clock: systemClock,
      idlePollMs: options.idlePollMs ?? IDLE_POLL_MS,
      // A failed claim is tried again at the shared pace whatever the idle poll's: it is no fallback.
      backoffBaseMs: IDLE_POLL_MS,
      maxBackoffMs: MAX_BACKOFF_MS,
      anyQueued: (runClass) => anyQueued(this.db, runClass),
    });
    events.on((event) => {
      if (event.kind === 'cancel') this.stop(event.id, 'cancel');
      // A queued run of that thread may go now.
      if (event.kind === 'thread') this.notify();
    });
  }

  /** Runs executing in this process now. */
  get active(): number {
    return this.#running.size;
  }

  /** The ids of the runs executing in this process now. */
  executing(): string[] {
    return [...this.#running.keys()];
  }

  /**
   * Executes a run that is already `running` in the store for this process; resolves with its
   * final row. A run started early (`startEarly`) is taken over: its held events go to
   * `listener` from here on.
   */
  execute(run: RunRow, listener?: RunListener): Promise<RunRow | undefined> {
    const early = this.#early.get(run.id);
    if (early) {
      this.#early.delete(run.id);
      if (this.#pastDeadline) early.start.controller.abort(new StopSignal('interrupted'));
      const done = this.#track(run, early.start.controller, early.done);
      early.start.admit(run, listener);
      return done;
    }
    const controller = new AbortController();
    // Past the drain deadline nothing starts: a request admitted while the drain began gets
    // its run ended `interrupted` at once, like the runs the drain cut short.
    if (this.#pastDeadline) controller.abort(new StopSignal('interrupted'));
    return this.#track(run, controller, this.#execution.execute(run, controller.signal, listener));
  }

  /**
   * Starts a held run's agent from its provisional row while its admission commits (see
   * runs/early-start.ts). The front then executes the admitted row as any other (`execute`
   * takes it over), or the submission refuses it. Undefined once the drain has passed its
   * deadline: nothing starts then.
   */
  startEarly(provisional: RunRow): EarlyStart | undefined {
    if (this.#pastDeadline || this.#early.has(provisional.id) || this.#running.has(provisional.id)) {
      return undefined;
    }
    const start = new EarlyStart();
    // In the next turn of the event loop: the admission statement, asked for just before, goes
    // out first, and the agent's set-up runs while the database works on it.
    const done = new Promise((resolve) => setImmediate(resolve)).then(() =>
      start.refused
        ? undefined
        : this.#execution.execute(provisional, start.controller.signal, start.relay, start.admission),
    );
    this.#early.set(provisional.id, { start, done });
    // Refused, it ends here; taken over, `execute` tracks it.
    void done.then(
      () => this.#early.delete(provisional.id),
      () => this.#early.delete(provisional.id),
    );
    return start;
  }

  /**
   * A run started early and admitted that its front never executed (the front failed before
   * it could): it ends `canceled` here, not left running for upkeep to find.
   */
  abandon(run: RunRow): void {
    if (!this.#early.has(run.id)) return;
    void this.execute(run).catch(() => undefined);
    this.stop(run.id, 'cancel');
  }

  #track(
    run: RunRow,
    controller: AbortController,
    execution: Promise<RunRow | undefined>,
  ): Promise<RunRow | undefined> {
    const done = execution.finally(() => {
      this.#running.delete(run.id);
      this.waiters.ended(run.id);
      if (run.thread_id !== null) {
        this.waiters.threadFreed(run.thread_id);
        this.notify();
      }
    });
    this.#running.set(run.id, { controller, done });
    this.#startWatch();
    return done;
  }

  /** Stops a run executing in this process; false when it is not here. */
  stop(id: string, reason: StopReason): boolean {
    const controller = this.#running.get(id)?.controller ?? this.#early.get(id)?.start.controller;
    if (!controller) return false;
    controller.abort(new StopSignal(reason));
    return true;
  }

  /** The final row of a run executing here, once it ends. */
  settled(id: string): Promise<RunRow | undefined> | undefined {
    return this.#running.get(id)?.done;
  }

  /**
   * Queued runs were written: wake idle workers now instead of at their next poll (one per
   * run given a class; every one without: a thread freed, scheduled runs promoted). See
   * WorkerLoops.notify.
   */
  notify(runClass?: RunClass, runs = 1): void {
    this.#workers.notify(runClass, runs);
  }

  /**
   * Starts the queue workers (after the server listens). They claim only while `mayClaim` says
   * so (the process's heartbeat is fresh, node/upkeep.ts: a run claimed by a process its peers
   * are about to declare lost would end `worker_lost`); otherwise they wait for their next look.
   */
  startWorkers(mayClaim: () => boolean = () => true): void {
    const lease = threadLeaseMs(this.settings);
    const allowed = () => {
      if (mayClaim()) return true;
      this.#claimsHeldBack++;
      return false;
    };
    this.#workers.start('default', this.settings.runConcurrency, async () =>
      allowed() ? claimDefaultRun(this.db, this.node, lease) : undefined,
    );
    // Deferred work has workers of its own: a deferred backlog never takes interactive capacity.
    this.#workers.start('deferred', this.settings.deferredConcurrency, async () =>
      allowed()
        ? claimDeferredRun(this.db, this.node, this.settings.deferredMaxRunningPerTenant, lease)
        : undefined,
    );
  }

  /** How many times a worker looked for work and was held back by `mayClaim`. */
  get claimsHeldBack(): number {
    return this.#claimsHeldBack;
  }

  readonly #scheduledListeners = new Set<() => void>();

  /** Runs were written to wait for their time: the promotion passes come often again (node/upkeep.ts). */
  scheduled(): void {
    for (const listener of this.#scheduledListeners) listener();
  }

  onScheduled(listener: () => void): () => void {
    this.#scheduledListeners.add(listener);
    return () => this.#scheduledListeners.delete(listener);
  }

  /** Claim nothing more; the loops end after their current run. */
  stopWorkers(): Promise<void> {
    return this.#workers.stop();
  }

  /**
   * Resolves when every local run has ended, or after `timeoutMs`; returns the ids still
   * running. Runs that start meanwhile (a request admitted as the drain began) are waited for
   * too, and any run that would start after the deadline is interrupted at once.
   */
  async settle(timeoutMs: number): Promise<string[]> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<'deadline'>(
      (resolve) => (timer = setTimeout(() => resolve('deadline'), timeoutMs)),
    );
    while (this.#running.size > 0) {
      const outcome = await Promise.race([
        Promise.allSettled([...this.#running.values()].map((r) => r.done)),
        deadline,
      ]);
      if (outcome === 'deadline') break;
    }
    clearTimeout(timer);
    this.#pastDeadline = true;
    return [...this.#running.keys()];
  }

  /** Stops every local run for `reason` and waits until each has ended. */
  async stopAll(reason: StopReason): Promise<void> {
    // Not the runs started early that wait for their admission: those are not running yet.
    const all = [...this.#running.values()];
    for (const { controller } of all) controller.abort(new StopSignal(reason));
    await Promise.allSettled(all.map((r) => r.done));
  }

  async close(): Promise<void> {
    await this.stopWorkers();
    clearInterval(this.#watch);
    this.#watch = undefined;
    await this.streams.close();
  }

  /** While runs execute here, look at them now and then: canceled elsewhere, or not ours any more. */
  #startWatch(): void {
    if (this.#watch) return;
    this.#watch = setInterval(() => void this.#look(), WATCH_MS);
    this.#watch.unref();
  }

  async #look(): Promise<void> {
    if (this.#running.size === 0) {
      clearInterval(this.#watch);
      this.#watch = undefined;
      return;
    }
    if (this.#watching) return;
    this.#watching = true;
    try {
      for (const { id, reason } of await runsToStop(this.db, this.node, [...this.#running.keys()])) {
        if (this.stop(id, reason))
          this.log('info', `stopping run: ${reason === 'cancel' ? 'canceled' : 'no longer ours'}`, {
            run: id,
          });
      }
    } catch {
      // The database is away: the liveness check of the node decides when to give up.
    } finally {
      this.#watching = false;
    }
  }
}
