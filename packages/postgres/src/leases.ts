import {
  budgetFigures,
  budgetStats,
  statsOf,
  type ConcurrencyLease,
  type ConcurrencyStats,
  type ResolvedLimits,
} from 'sluice/concurrency';
import type { Database } from './database.js';
import { parseCapacity } from './pass-capacity.js';
import type { LeaseRow, LimiterQueries } from './queries.js';

/** A lease row as the limiter hands it out; times are the database's. */
export function leaseOf(limiter: string, row: LeaseRow): ConcurrencyLease<string> {
  return {
    id: row.id,
    limiter,
    workload: row.workload,
    acquiredAt: row.acquired_at,
    expiresAt: row.expires_at,
    fence: row.fence,
  };
}

/**
 * Runs a claim or a renewal. Both only push an expiry later: if a database crash forgot one,
 * the lease would just lapse sooner (its holder then loses it, safely), so they need not wait
 * for a WAL flush, whatever `synchronousCommit` says about grants.
 */
export function extendLeases(db: Database, sql: string, params: unknown[]): Promise<LeaseRow[]> {
  return db.transaction(async (tx) => (await tx.query<LeaseRow>(sql, params)).rows, {
    synchronousCommit: false,
  });
}

/**
 * Active and queued counts of one limiter, the effective limit and the budgets, read in
 * database time (the budgets as stored, refilled to now).
 */
export async function readStats<W extends string>(
  db: Database,
  queries: LimiterQueries,
  limits: ResolvedLimits<W>,
  queueEntryTtlMs: number,
): Promise<ConcurrencyStats<W>> {
  const [rows, stored] = await Promise.all([
    db
      .query<{ kind: 'active' | 'queued'; workload: string; n: number }>(queries.stats, [
        limits.name,
        queueEntryTtlMs,
      ])
      .then((r) => r.rows),
    db
      .query<{ capacity: string | null; now_ms: number }>(queries.capacity, [limits.name])
      .then((r) => r.rows[0]),
  ]);
  const index = new Map<string, number>(limits.workloads.map((w) => [w.name, w.index]));
  const counts = { active: limits.workloads.map(() => 0), queued: limits.workloads.map(() => 0) };
  for (const row of rows) {
    const i = index.get(row.workload);
    if (i !== undefined) counts[row.kind][i] = row.n;
  }
  const now = stored?.now_ms ?? 0;
  const capacity = parseCapacity(limits, stored?.capacity ?? null, now);
  return statsOf(limits, counts, {
    limit: capacity.limit,
    // Learned budgets too, as the in-memory limiter shows them.
    budgets: budgetStats(budgetFigures(limits.rate, capacity.learned), capacity.buckets, now),
  });
}
