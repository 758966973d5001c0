/**
 * The peer for bench/postgres-limiter: the design the spec describes, where every waiting
 * request checks for a slot on its own every `pollIntervalMs` with one short transaction on
 * the limiter's row lock, and a release only deletes the lease (nobody hands the slot on).
 *
 * It uses the same tables, the same SQL functions and the same allocation rules as
 * @sluice/postgres, so the comparison is between the two designs, not two code bases.
 */
import { randomUUID } from 'node:crypto';
import { allocate, type ConcurrencyLease } from 'sluice/concurrency';
import type { Database } from '@sluice/postgres/database';

interface StoredLimits {
  maxConcurrent: number;
  workloads: { name: string; maxConcurrent: number; reserved: number; priority: number }[];
}

export class SpecPollingLimiter {
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
  ) {}

  /** One poll: take the row lock, then take a slot if the rules give this request one. */
  async #try(
    waiterId: string,
    op: 'enqueue' | 'heartbeat',
    workload: string,
  ): Promise<ConcurrencyLease | undefined> {
    const s = `"${this.schema}"`;
    return this.db.transaction(
      async (tx) => {
        const rows = (
          await tx.query<{
            kind: string;
            workload: string | null;
            n: number | null;
            id: string | null;
            owner: string | null;
            seq: number | null;
          }>(
            `SELECT * FROM ${s}.concurrency_pass($1::text, $2::text, $3::uuid[], $4::text[], $5::float8[],
            $6::uuid[], $7::uuid[], $8::uuid[], $9::float8, $10::int, $11::float8)`,
            [
              this.name,
              'spec',
              op === 'enqueue' ? [waiterId] : [],
              op === 'enqueue' ? [workload] : [],
              op === 'enqueue' ? [null] : [],
              [],
              [],
              op === 'heartbeat' ? [waiterId] : [],
              this.options.queueEntryTtlMs,
              this.options.maxConcurrent,
              this.options.leaseTtlMs,
            ],
          )
        ).rows;
        const stored = JSON.parse(rows.find((r) => r.kind === 'limits')!.id!) as StoredLimits;
        const index = new Map(stored.workloads.map((w, i) => [w.name, i]));
        const active = stored.workloads.map(() => 0);
        const waiting: { seq: number; id: string }[][] = stored.workloads.map(() => []);
        for (const r of rows) {
          const i = r.workload === null ? undefined : index.get(r.workload);
          if (i === undefined) continue;
          if (r.kind === 'active') active[i] = r.n!;
          if (r.kind === 'head') waiting[i]!.push({ seq: r.seq!, id: r.id! });
        }
        const reserved = stored.workloads.reduce((a, w) => a + w.reserved, 0);
        const grants = allocate({
          limits: {
            maxConcurrent: stored.maxConcurrent,
            sharedSlots: stored.maxConcurrent - reserved,
            workloads: stored.workloads,
          },
          active,
          waiting,
          now: 0,
        }).grants;
        const mine = grants.find((g) => g.entry.id === waiterId);
        if (!mine) return undefined;
        const row = (
          await tx.query<{ id: string; acquired_at: number; expires_at: number; fence: number }>(
            `SELECT * FROM ${s}.concurrency_grant($1::text, $2::uuid[], $3::text[], $4::text[], $5::boolean[],
            $6::float8[], $7::uuid[], $8::float8, $9::float8, $10::text)`,
            [
              this.name,
              [waiterId],
              [workload],
              ['spec'],
              [true],
              [mine.entry.seq],
              [],
              this.options.leaseTtlMs,
              this.options.leaseTtlMs,
              'unused_',
            ],
          )
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
