import { randomBytes } from 'node:crypto';
import { RunTimeoutError } from 'sluice';
import type { Database } from '@sluice/postgres/database';
import type { SluiceConfig } from '../config.js';
import type { ServerSettings } from '../settings.js';
import {
  claimDeferredRun,
  claimQueuedRun,
  expireDeferredRuns,
  failLostRuns,
  finishRun,
  heartbeat,
  interruptRuns,
  promoteDueRuns,
  type Caps,
  type RunRow,
} from './store.js';

/**
 * Runs agents for this process: inline runs on the request that carried them, queued runs on
 * `runConcurrency` workers that take the oldest queued run. Keeps the abort handle of every
 * run executing here, for cancellation.
 */
export class Executor {
  readonly worker = `w_${randomBytes(6).toString('hex')}`;
  readonly #running = new Map<string, { controller: AbortController; done: Promise<RunRow | undefined> }>();
  #wake: (() => void) | undefined;
  #stopped = false;
  #loops: Promise<void>[] = [];
  #timer: ReturnType<typeof setInterval> | undefined;

  #scheduler: ReturnType<typeof setInterval> | undefined;

  constructor(
    private readonly db: Database,
    private readonly agents: SluiceConfig['agents'],
    private readonly settings: ServerSettings,
    private readonly capsFor: (tenant: string) => Caps,
    /** Called with each run that ended here (callbacks). */
    private readonly onFinished: (run: RunRow) => Promise<void> = async () => undefined,
  ) {}

  /** Executes a run that is already `running` in the store; resolves with its final row. */
  execute(run: RunRow): Promise<RunRow | undefined> {
    const controller = new AbortController();
    const done = this.#execute(run, controller.signal)
      .then((final) => {
        if (final?.callback_url) void this.onFinished(final);
        return final;
      })
      .finally(() => this.#running.delete(run.id));
    this.#running.set(run.id, { controller, done });
    return done;
  }

  async #execute(run: RunRow, signal: AbortSignal): Promise<RunRow | undefined> {
    const agent = this.agents[run.agent];
    if (!agent) {
      return finishRun(this.db, run.id, {
        status: 'failed',
        error: { type: 'agent_error', message: `unknown agent ${run.agent}` },
      });
    }
    const prompt = typeof run.input === 'string' ? run.input : JSON.stringify(run.input);
    try {
      const result = await (
        agent as { run(o: object): Promise<{ text: string; data: unknown; usage: unknown }> }
      ).run({
        prompt,
        signal,
        timeoutMs: this.settings.maxDurationMs,
      });
      return await finishRun(this.db, run.id, {
        status: 'succeeded',
        output: result.data === undefined ? { text: result.text } : { text: result.text, data: result.data },
        usage: result.usage,
      });
    } catch (error) {
      if (signal.aborted) return finishRun(this.db, run.id, { status: 'canceled' });
      const timedOut = error instanceof RunTimeoutError;
      return finishRun(this.db, run.id, {
        status: 'failed',
        error: {
          type: timedOut ? 'max_duration_exceeded' : 'agent_error',
          message: error instanceof Error ? error.message : String(error),
        },
      });
    }
  }

  /** Stops a run executing in this process; false if it is not here. */
  cancel(id: string): boolean {
    const entry = this.#running.get(id);
    if (!entry) return false;
    entry.controller.abort(new Error('canceled'));
    return true;
  }

  /** The final row of a run executing here, once it ends. */
  settled(id: string): Promise<RunRow | undefined> | undefined {
    return this.#running.get(id)?.done;
  }

  /** A queued run was written: wake an idle worker now instead of at its next poll. */
  notify(): void {
    this.#wake?.();
  }

  /**
   * Registers this node, ends the runs of nodes that died while running them (`worker_lost`),
   * and starts the workers. Queued runs need no recovery: they are in the database, and the
   * workers take them.
   */
  async start(): Promise<void> {
    const staleMs = this.settings.nodeStaleMs;
    await heartbeat(this.db, this.worker);
    await failLostRuns(this.db, staleMs);
    this.#timer = setInterval(
      () => {
        void heartbeat(this.db, this.worker)
          .then(() => failLostRuns(this.db, staleMs))
          .then(() => expireDeferredRuns(this.db, this.settings.deferredMaxWaitMs))
          .catch(() => undefined);
      },
      Math.max(50, Math.floor(staleMs / 4)),
    );
    this.#timer.unref();
    // Due scheduled runs move to their queue; a worker is woken when some did.
    this.#scheduler = setInterval(() => void this.promoteNow().catch(() => undefined), 250);
    this.#scheduler.unref();
    for (let i = 0; i < this.settings.runConcurrency; i++) {
      this.#loops.push(this.#loop(() => claimQueuedRun(this.db, this.worker)));
    }
    // Deferred work has workers of its own: a deferred backlog never takes interactive capacity.
    for (let i = 0; i < this.settings.deferredConcurrency; i++) {
      this.#loops.push(
        this.#loop(() => claimDeferredRun(this.db, this.worker, this.settings.deferredMaxRunningPerTenant)),
      );
    }
  }

  /** Moves due scheduled runs to their queues now (the scheduler does it every 250 ms); returns how many. */
  async promoteNow(): Promise<number> {
    const promoted = await promoteDueRuns(this.db, this.capsFor);
    if (promoted > 0) this.notify();
    return promoted;
  }

  /** Runs executing in this process now. */
  get active(): number {
    return this.#running.size;
  }

  /**
   * Graceful stop: take no more work, give local runs up to `drainTimeoutMs`, then mark the
   * rest `interrupted` (they are not retried: they may have had side effects) and abort them.
   * Returns the interrupted run ids.
   */
  async drain(): Promise<string[]> {
    this.#stopped = true;
    this.#wake?.();
    clearInterval(this.#timer);
    clearInterval(this.#scheduler);
    const pending = [...this.#running.values()].map((r) => r.done);
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      Promise.allSettled(pending),
      new Promise((resolve) => (timer = setTimeout(resolve, this.settings.drainTimeoutMs))),
    ]);
    clearTimeout(timer);
    let interrupted: string[] = [];
    if (this.#running.size > 0) {
      interrupted = await interruptRuns(this.db, this.worker).catch(() => []);
      for (const { controller } of this.#running.values()) controller.abort(new Error('server stopping'));
      await Promise.allSettled([...this.#running.values()].map((r) => r.done));
    }
    await Promise.allSettled(this.#loops);
    return interrupted;
  }

  async #loop(claim: () => Promise<RunRow | undefined>): Promise<void> {
    while (!this.#stopped) {
      let run: RunRow | undefined;
      try {
        run = await claim();
      } catch {
        run = undefined;
      }
      if (run) {
        await this.execute(run);
        continue;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 500);
        const previous = this.#wake;
        this.#wake = () => {
          clearTimeout(timer);
          previous?.();
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }

  /** Immediate stop (tests, errors at start): aborts everything still running. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    clearInterval(this.#timer);
    clearInterval(this.#scheduler);
    for (const { controller } of this.#running.values()) controller.abort(new Error('server stopping'));
    await Promise.allSettled([...this.#running.values()].map((r) => r.done));
    await Promise.allSettled(this.#loops);
  }
}
