import type { Clock } from 'sluice/concurrency';
import { Batcher } from './batcher.js';
import type { Database } from './database.js';
import { channelPrefix } from './hub.js';
import type { PostgresSettings } from './options.js';
import type { OutageWatch } from './outage.js';
import type { ReleaseDetails, TokenCost } from 'sluice/concurrency';
import {
  decodePass,
  planPass,
  type Enqueue,
  type EnqueueOutcome,
  type PassRow,
  type SettledRelease,
} from './pass.js';
import type { ReleaseOutcome } from './pass-capacity.js';
import type { LimiterMetrics } from './metrics.js';
import type { LeaseRow, LimiterQueries } from './queries.js';

/** What one caller has to say to the limiter in a pass; a pass carries a batch of them. */
export interface PassInput {
  enqueue?: Enqueue & { readonly tokens: TokenCost };
  release?: string;
  /** How the released lease's request went: its usage and the provider's answer. */
  releaseDetails?: { readonly fence: number | undefined; readonly details: ReleaseDetails };
  cancel?: string;
  /** Waiters of this limiter to keep alive, and whose pending offers to claim. */
  heartbeat?: string[];
}

export interface PassResult {
  outcome: EnqueueOutcome | undefined;
  /** For a heartbeat: which of the waiters still have their queue entry. */
  present: ReadonlySet<string> | undefined;
  /** For a release with details: the pause or the move of the limit it caused. */
  released: ReleaseOutcome | undefined;
}

export type PassMetrics = Pick<
  LimiterMetrics,
  'passes' | 'failedPasses' | 'directGrants' | 'offersMade' | 'offersClaimedOnPoll'
>;

export interface PassContext {
  readonly db: Database;
  readonly queries: LimiterQueries;
  readonly name: string;
  /** This process, as the queue knows it (its LISTEN hub's owner id). */
  readonly owner: string;
  readonly settings: PostgresSettings;
  readonly maxConcurrent: number;
  readonly leaseTtlMs: number;
  readonly clock: Clock;
  readonly outage: OutageWatch;
  readonly metrics: PassMetrics;
  /** A lease for a waiter of this process, after commit. */
  deliver(row: LeaseRow): void;
}

/**
 * The allocation passes of one limiter object. A pass is one short transaction on the
 * limiter's row lock: `concurrency_pass_v3` (lock, the batch's changes, sweep, state), the
 * decisions of pass.ts, `concurrency_grant` when anyone gets a slot, commit. At most one pass
 * is in flight; everything said meanwhile goes into the next, so a process has at most one
 * transaction waiting for the row lock, however busy it is. Every pass is under the outage
 * watch.
 */
export class PassRunner {
  /** When the next known lease lapses, on the local clock (from the last pass). */
  nextExpiryAt = Infinity;
  /**
   * When a request waits for a refill or for the pause's end, the moment to look again, on the
   * local clock (from the last pass); Infinity when none does.
   */
  wakeAt = Infinity;
  readonly #batcher = new Batcher<PassInput, PassResult>((inputs) => this.#watched(inputs));

  constructor(private readonly ctx: PassContext) {}

  submit(input: PassInput): Promise<PassResult> {
    return this.#batcher.submit(input);
  }

  async #watched(inputs: PassInput[]): Promise<PassResult[]> {
    try {
      return await this.ctx.outage.watch(() => this.#run(inputs));
    } catch (error) {
      this.ctx.metrics.failedPasses++;
      throw error;
    }
  }

  async #run(inputs: PassInput[]): Promise<PassResult[]> {
    const { db, queries: q, name, owner, settings, metrics } = this.ctx;
    const enqueues = inputs.flatMap((i) => (i.enqueue ? [i.enqueue] : []));
    const settled: SettledRelease[] = inputs.flatMap((i) =>
      i.release && i.releaseDetails ? [{ leaseId: i.release, ...i.releaseDetails }] : [],
    );
    const { grants, state, plan } = await db.transaction(
      async (tx) => {
        const rows = (
          await tx.query<PassRow>(q.pass, [
            name,
            owner,
            enqueues.map((e) => e.id),
            enqueues.map((e) => e.workload),
            enqueues.map((e) => e.timeoutMs ?? null),
            enqueues.map((e) => e.key),
            enqueues.map((e) => e.tokens.input),
            enqueues.map((e) => e.tokens.output),
            inputs.flatMap((i) => (i.release ? [i.release] : [])),
            inputs.flatMap((i) => (i.cancel ? [i.cancel] : [])),
            inputs.flatMap((i) => i.heartbeat ?? []),
            settings.queueEntryTtlMs,
            this.ctx.maxConcurrent,
            this.ctx.leaseTtlMs,
          ])
        ).rows;
        const state = decodePass(rows);
        if (!state) throw new Error(`limiter \`${name}\` is not registered in schema \`${settings.schema}\``);
        const plan = planPass(state, enqueues, settled);
        let grants: LeaseRow[] = [];
        if (plan.grants.length > 0 || plan.dropped.length > 0 || plan.capacity !== undefined) {
          const chosen = plan.grants;
          grants = (
            await tx.query<LeaseRow>(q.grant, [
              name,
              chosen.map((g) => g.id),
              chosen.map((g) => g.workload),
              chosen.map((g) => g.owner),
              chosen.map((g) => g.owner === owner),
              chosen.map((g) => g.seq),
              plan.dropped,
              this.ctx.leaseTtlMs,
              settings.offerTtlMs,
              channelPrefix,
              chosen.map((g) => g.tokens.input),
              chosen.map((g) => g.tokens.output),
              plan.capacity ?? null,
              state.nowMs,
            ])
          ).rows;
        }
        return { grants, state, plan };
      },
      { synchronousCommit: settings.synchronousCommit },
    );
    const localNow = this.ctx.clock.now();
    this.nextExpiryAt = state.nextExpiryMs === undefined ? Infinity : localNow + state.nextExpiryMs;
    // The database's time of the pass maps to the local clock by the offset of this pass.
    this.wakeAt = plan.wakeAt === undefined ? Infinity : localNow + Math.max(0, plan.wakeAt - state.nowMs);
    metrics.passes++;
    const direct = grants.filter((g) => !g.offered && g.owner === owner);
    metrics.directGrants += direct.length;
    metrics.offersMade += grants.length - direct.length;
    metrics.offersClaimedOnPoll += state.claimed.length;
    // After commit: hand direct grants and claimed offers to the waiters of this process.
    for (const row of [...direct, ...state.claimed]) this.ctx.deliver(row);
    return inputs.map((input) => ({
      outcome: input.enqueue ? plan.outcomes.get(input.enqueue.id) : undefined,
      present: input.heartbeat ? state.present : undefined,
      released: input.release && input.releaseDetails ? plan.releases.get(input.release) : undefined,
    }));
  }
}
