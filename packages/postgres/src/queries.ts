import { quoteIdent } from './schema.js';

/**
 * Every statement the limiter runs, in one place. Times are database time
 * (`clock_timestamp()`), returned as epoch milliseconds in float8 so that node-postgres and
 * PGlite hand back the same numbers. Parameters are cast, so plans do not depend on how a
 * driver types them.
 *
 * An allocation ("pass") is one short READ COMMITTED transaction holding the limiter's row
 * lock: `pass` (lock, the caller's change, sweep, state), then the shared `allocate` rules in
 * JavaScript, then `grant` when anyone gets a slot, then COMMIT. A first version ran the
 * steps as separate statements: 6 round trips under the lock and about 3 ms a pass on the
 * 2-core test machine; as two PL/pgSQL functions, the lock is held for 2 or 3 round trips.
 *
 * Renewal and claiming an offer need no lock: each only extends a lease that is still
 * unexpired, and never brings back an expired or released one.
 */
export function limiterQueries(schema: string) {
  const s = quoteIdent(schema);
  const ms = (column: string) => `(extract(epoch FROM ${column}) * 1000)::float8`;
  const leaseColumns = `id::text AS id, workload, fence::float8 AS fence, owner, offered, waiter_id::text AS waiter_id,
    ${ms('acquired_at')} AS acquired_at, ${ms('expires_at')} AS expires_at`;
  return {
    registerLimits: `INSERT INTO ${s}.concurrency_limiters (name, limits) VALUES ($1::text, $2::jsonb)
      ON CONFLICT (name) DO NOTHING`,
    readLimits: `SELECT limits FROM ${s}.concurrency_limiters WHERE name = $1::text`,
    replaceLimits: `UPDATE ${s}.concurrency_limiters SET limits = $2::jsonb, updated_at = clock_timestamp()
      WHERE name = $1::text`,

    // See concurrency_pass_v4 and concurrency_grant_v4 (sql/004_capacity.sql); pass.ts decodes
    // the rows and decides the grants (and the budgets' new levels) between them.
    pass: `SELECT * FROM ${s}.concurrency_pass_v4($1::text, $2::text, $3::uuid[], $4::text[], $5::float8[],
      $6::text[], $7::float8[], $8::float8[], $9::uuid[], $10::uuid[], $11::uuid[], $12::float8, $13::int,
      $14::float8)`,
    grant: `SELECT * FROM ${s}.concurrency_grant_v4($1::text, $2::uuid[], $3::text[], $4::text[], $5::boolean[],
      $6::float8[], $7::uuid[], $8::float8, $9::float8, $10::text, $11::float8[], $12::float8[], $13::jsonb, $14::float8)`,

    // The capacity as stored, and the database's time, for stats().
    capacity: `SELECT capacity::text AS capacity, (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms
      FROM ${s}.concurrency_limiters WHERE name = $1::text`,

    // Takes offered slots for waiters of this process: the lease gets its full TTL.
    claim: `UPDATE ${s}.concurrency_leases
      SET offered = false, expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
      WHERE id = ANY($1::uuid[]) AND offered AND expires_at > clock_timestamp()
      RETURNING ${leaseColumns}`,

    renew: `UPDATE ${s}.concurrency_leases
      SET expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
      WHERE id = $1::uuid AND NOT offered AND expires_at > clock_timestamp()
      RETURNING ${leaseColumns}`,

    stats: `WITH now AS (SELECT clock_timestamp() AS t)
      SELECT 'active' AS kind, workload, count(*)::int AS n FROM ${s}.concurrency_leases, now
        WHERE limiter = $1::text AND expires_at > now.t GROUP BY workload
      UNION ALL
      SELECT 'queued', workload, count(*)::int FROM ${s}.concurrency_waiters, now
        WHERE limiter = $1::text AND heartbeat_at > now.t - $2::float8 * interval '1 millisecond'
          AND (deadline IS NULL OR deadline > now.t) GROUP BY workload`,
  };
}

export type LimiterQueries = ReturnType<typeof limiterQueries>;

export interface LeaseRow {
  id: string;
  workload: string;
  fence: number;
  owner: string;
  offered: boolean;
  waiter_id: string | null;
  acquired_at: number;
  expires_at: number;
}
