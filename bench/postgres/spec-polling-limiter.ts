/**
 * The peer for bench/postgres-limiter: the design the spec describes, where every waiting
 * request checks for a slot on its own every `pollIntervalMs` with one short transaction on
 * the limiter's row lock, and a release only deletes the lease (nobody hands the slot on).
 *
 * It uses the same tables, the same SQL functions and the same allocation rules as
 * @sluice/postgres, so the comparison is between the two designs, not two code bases.
 */
import { randomUUID } from 'node:crypto';
import type { ConcurrencyLease } from 'sluice/concurrency';
import type { Database } from '@sluice/postgres/database';
// The package's own statements and decoder (internal modules, read from its sources): a
// change to the SQL functions breaks this peer at compile time, not in the middle of a run.
import { decodePass, planPass, type PassRow } from '../../packages/postgres/src/pass.js';
import { limiterQueries, type LeaseRow } from '../../packages/postgres/src/queries.js';

export class SpecPollingLimiter {
  readonly #q: ReturnType<typeof limiterQueries>;

  constructor(
    private readonly db: Database,
    private readonly schema: string,
    readonly name: string,
    private readonly options: {
      pollIntervalMs: number;
      leaseTtlMs: number;
      queueEntryTtlMs: number;
      maxConcurrent: number;
      synchronousCommit: boolean;
    },
  ) {
    this.#q = limiterQueries(schema);
  }

  /** One poll: take the row lock, then take a slot if the rules give this request one. */
  async #try(
    waiterId: string,
    op: 'enqueue' | 'heartbeat',
    workload: string,
  ): Promise<ConcurrencyLease | undefined> {
    return this.db.transaction(
      async (tx) => {
        const rows = (
          await tx.query<PassRow>(this.#q.pass, [
            this.name,
            'spec',
            op === 'enqueue' ? [waiterId] : [],
            op === 'enqueue' ? [workload] : [],
            op === 'enqueue' ? [null] : [],
            op === 'enqueue' ? [''] : [],
            op === 'enqueue' ? [0] : [],
            op === 'enqueue' ? [0] : [],
            [],
            [],
            op === 'heartbeat' ? [waiterId] : [],
            this.options.queueEntryTtlMs,
            this.options.maxConcurrent,
            this.options.leaseTtlMs,
          ])
        ).rows;
        const state = decodePass(rows)!;
        // The same allocation rules as the package (no budgets here, so no capacity to write).
        const mine = planPass(state, []).grants.find((g) => g.id === waiterId);
        if (!mine) return undefined;
        const row = (
          await tx.query<LeaseRow>(this.#q.grant, [
            this.name,
            [waiterId],
            [workload],
            ['spec'],
            [true],
            [mine.seq],
            [],
            this.options.leaseTtlMs,
            this.options.leaseTtlMs,
            'unused_',
            [0],
            [0],
            null,
            state.nowMs,
          ])
        ).rows[0]!;
        return {
          id: row.id,
          limiter: this.name,
          workload,
          acquiredAt: row.acquired_at,
          expiresAt: row.expires_at,
          fence: row.fence,
        };
      },
      { synchronousCommit: this.options.synchronousCommit },
    );
  }

  async acquire(workload: string): Promise<ConcurrencyLease> {
    const id = randomUUID();
    let lease = await this.#try(id, 'enqueue', workload);
    while (!lease) {
      await new Promise((r) => setTimeout(r, this.options.pollIntervalMs));
      lease = await this.#try(id, 'heartbeat', workload);
    }
    return lease;
  }

  async release(lease: ConcurrencyLease): Promise<void> {
    await this.db.query(`DELETE FROM "${this.schema}".concurrency_leases WHERE id = $1::uuid`, [lease.id]);
  }
}
