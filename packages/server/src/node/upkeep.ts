import type { Database } from '@sluice/postgres/database';
import { systemClock, type Clock } from 'sluice/concurrency';
import type { Executor } from '../runs/executor.js';
import { reconcileDrifted } from '../runs/admission-counts.js';
import type { TenantLimits } from '../runs/policy.js';
import { endOrphanedRuns, expireRuns, failLostRuns } from '../runs/lifecycle.js';
import { promotionPass } from '../runs/scheduler.js';
import type { ServerSettings } from '../settings.js';
import { tuning } from '../tuning.js';
import { renewThreadLeases, threadLeaseMs } from '../threads/store.js';
import { heartbeat, pruneNodes } from './nodes.js';
import { pruneAdmissionFences } from '../runs/admission-settle.js';
import { pruneWatches } from '../runs/watching.js';
import { PromotionPasses } from './promotion.js';

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

const { promoteMs: PROMOTE_MS, orphanGraceMs: ORPHAN_GRACE_MS } = tuning;

/**
 * The periodic work of a server process: its heartbeat, ending the runs of processes that died,
 * expiry, promotion of due scheduled runs, and retention. Each job runs at most once at a time
 * (a slow database never piles passes on top of each other), and no failure escapes.
 *
 * A process whose heartbeat is late (`beating()` false: none written for half the stale time,
 * or `tuning.heartbeatLateFloorMs` when that is longer) claims no run and is not ready: its
 * heartbeat may be held by a stalled connection rather than failing, and a run it claimed then
 * would be declared `worker_lost` by its peers. Its running runs go on; it stops them only
 * when the heartbeat fails for three quarters of the stale time: peers are about to declare
 * them lost, and a run nobody can record must not go on spending.
 */
export class NodeUpkeep {
  #timers: ReturnType<typeof setInterval>[] = [];
  #busy = new Set<string>();
  #stopPromotion: () => void = () => undefined;
  #lastBeat: number;
  /** When the last heartbeat was written, by the monotonic clock (the app's may be a test's, jumping hours). */
  #lastBeatMono: number | undefined;
  readonly #jobs: { name: string; everyMs: number; job: () => Promise<unknown> }[] = [];

  constructor(
    private readonly db: Database,
    private readonly executor: Executor,
    private readonly settings: ServerSettings,
    private readonly limitsFor: (tenant: string) => TenantLimits,
    private readonly log: Log = () => undefined,
    private readonly clock: Clock = systemClock,
    private readonly options: { promoteIdleMs?: number } = {},
  ) {
    this.#lastBeat = clock.now();
  }

  /** Registers the process and ends the runs of dead ones; throws when the database is away (start fails). */
  async start(): Promise<void> {
    await heartbeat(this.db, this.executor.node);
    this.#lastBeat = this.clock.now();
    this.#lastBeatMono = performance.now();
    await failLostRuns(this.db, this.settings.nodeStaleMs);
    const every = (ms: number, name: string, job: () => Promise<unknown>) => {
      const timer = setInterval(() => void this.#once(name, job), ms);
      timer.unref();
      this.#timers.push(timer);
    };
    every(Math.max(25, Math.floor(this.settings.nodeStaleMs / 4)), 'heartbeat', () => this.#beat());
    every(Math.max(25, Math.floor(this.settings.nodeStaleMs / 4)), 'sweep', async () => {
      const ended =
        (await failLostRuns(this.db, this.settings.nodeStaleMs)) +
        (await endOrphanedRuns(this.db, this.executor.node, this.executor.executing(), ORPHAN_GRACE_MS));
      await expireRuns(this.db, this.settings.deferredMaxWaitMs);
      // Runs ended here free their tenants' caps (and a run without a thread notifies nobody):
      // the idle workers look now, not at their next poll.
      if (ended > 0) this.executor.notify();
    });
    const passes = new PromotionPasses(
      async () => {
        let waiting = true;
        await this.#once('promote', async () => (waiting = (await this.#promote()).waiting));
        return waiting;
      },
      systemClock,
      PROMOTE_MS,
      this.options.promoteIdleMs ?? tuning.promoteIdleMs,
    );
    const unlisten = this.executor.onScheduled(() => passes.scheduled());
    passes.start();
    this.#stopPromotion = () => {
      passes.stop();
      unlisten();
    };
    every(tuning.pruneNodesEveryMs, 'prune', async () => {
      await pruneNodes(this.db);
      await pruneAdmissionFences(this.db);
      await pruneWatches(this.db);
    });
    every(tuning.admissionReconcileMs, 'reconcile', async () => {
      // A running count set lower makes room for that tenant's queued deferred runs.
      if ((await reconcileDrifted(this.db)).length > 0) this.executor.notify('deferred');
    });
    for (const { name, everyMs, job } of this.#jobs) every(everyMs, name, job);
  }

  /** Adds a periodic job of another area (schedule triggers' ticks); call before `start`. */
  addJob(name: string, everyMs: number, job: () => Promise<unknown>): void {
    this.#jobs.push({ name, everyMs, job });
  }

  /** Moves due scheduled runs to their queues now; returns how many. */
  async promoteNow(): Promise<number> {
    const { promoted } = await this.#promote();
    return promoted;
  }

  async #promote(): Promise<{ promoted: number; waiting: boolean }> {
    const pass = await promotionPass(this.db, this.limitsFor);
    if (pass.promoted > 0) this.executor.notify();
    return pass;
  }

  /**
   * Whether this process's heartbeat is fresh enough to claim runs and answer ready (see the
   * class). True before `start`: a process that runs no upkeep has no heartbeat to be late.
   */
  beating(): boolean {
    return this.#lastBeatMono === undefined || performance.now() - this.#lastBeatMono <= this.#lateMs();
  }

  #lateMs(): number {
    return Math.max(this.settings.nodeStaleMs / 2, tuning.heartbeatLateFloorMs);
  }

  async #beat(): Promise<void> {
    // Fresh from when the write was sent, not from when its answer was read: an answer held up
    // on its way back must not make an old row look new.
    const sentAt = performance.now();
    try {
      await heartbeat(this.db, this.executor.node);
      this.#lastBeat = this.clock.now();
      const wasLate = !this.beating();
      const silentMs = performance.now() - (this.#lastBeatMono ?? sentAt);
      this.#lastBeatMono = sentAt;
      if (wasLate && this.beating()) {
        this.log('warn', 'heartbeat written again after being late; claiming runs again', {
          silent_ms: Math.round(silentMs),
        });
        this.executor.notify();
      }
      // The threads held by runs executing here stay held while they live.
      await renewThreadLeases(this.db, this.executor.executing(), threadLeaseMs(this.settings));
    } catch (error) {
      const silentMs = this.clock.now() - this.#lastBeat;
      if (silentMs > (this.settings.nodeStaleMs * 3) / 4 && this.executor.active > 0) {
        this.log('error', 'heartbeat failing; stopping local runs before peers declare them lost', {
          silent_ms: silentMs,
        });
        await this.executor.stopAll('lost');
      }
      throw error;
    }
  }

  async #once(name: string, job: () => Promise<unknown>): Promise<void> {
    if (this.#busy.has(name)) return;
    this.#busy.add(name);
    try {
      await job();
    } catch (error) {
      this.log('warn', `${name} failed`, { error: String(error) });
    } finally {
      this.#busy.delete(name);
    }
  }

  /** Stops the jobs. The heartbeat is stopped last by the caller: during a drain it must go on. */
  stop(): void {
    for (const timer of this.#timers.splice(0)) clearInterval(timer);
    this.#stopPromotion();
  }
}
