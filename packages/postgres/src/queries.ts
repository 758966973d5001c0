import { quoteIdent } from './schema.js';

/**
 * Every statement the limiter runs, in one place. Times are database time
 * (`clock_timestamp()`), returned as epoch milliseconds in float8 so that node-postgres and
 * PGlite hand back the same numbers. Parameters are cast, so the plans do not depend on how
 * a driver types them.
 *
 * An allocation ("pass") is one short READ COMMITTED transaction on the limiter's row lock:
 *
 *   lock       take the row lock, alone. (A change made in the same statement, before the
 *              lock is granted, would hold row locks while waiting for it: a deadlock with
 *              a pass that sweeps those rows.)
 *   change     the caller's change, if any: release, cancel, enqueue, heartbeat.
 *   state      a new statement, so a new snapshot taken after the lock: sweep expired leases
 *              and dead queue entries, then read the slots in use and the heads of each
 *              workload's queue, with `clock_timestamp()` read after the lock (`now()` would
 *              be the transaction start, stale after a lock wait).
 *   grant      write the grants the shared `allocate` rules chose, and NOTIFY the processes
 *              that got an offer. NOTIFY is sent at commit.
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

    lock: `SELECT limits FROM ${s}.concurrency_limiters WHERE name = $1::text FOR UPDATE`,
    release: `DELETE FROM ${s}.concurrency_leases WHERE id = $2::uuid AND limiter = $1::text`,
    // A cancelled or timed-out waiter leaves the queue and gives back any slot it was offered
    // or granted but has not taken.
    cancel: `WITH w AS (DELETE FROM ${s}.concurrency_waiters WHERE id = $1::uuid)
      DELETE FROM ${s}.concurrency_leases WHERE waiter_id = $1::uuid`,
    enqueue: `INSERT INTO ${s}.concurrency_waiters (id, limiter, workload, seq, owner, enqueued_at, deadline, heartbeat_at)
      VALUES ($2::uuid, $1::text, $3::text, nextval('${s}.concurrency_arrival'), $4::text, clock_timestamp(),
        clock_timestamp() + $5::float8 * interval '1 millisecond', clock_timestamp())`,
    heartbeat: `UPDATE ${s}.concurrency_waiters SET heartbeat_at = clock_timestamp()
      WHERE id = ANY($1::uuid[]) RETURNING id::text AS id`,

    // $1 limiter, $2 queue entry TTL (ms), $3 how many heads per workload to read,
    // $4 waiter ids whose pending offers to return.
    state: `WITH now AS (SELECT clock_timestamp() AS t),
        swept_leases AS (DELETE FROM ${s}.concurrency_leases
          WHERE limiter = $1::text AND expires_at <= (SELECT t FROM now)),
        swept_waiters AS (DELETE FROM ${s}.concurrency_waiters
          WHERE limiter = $1::text AND (heartbeat_at <= (SELECT t FROM now) - $2::float8 * interval '1 millisecond'
            OR deadline <= (SELECT t FROM now))),
        live AS (SELECT * FROM ${s}.concurrency_waiters, now
          WHERE limiter = $1::text AND heartbeat_at > now.t - $2::float8 * interval '1 millisecond'
            AND (deadline IS NULL OR deadline > now.t))
      SELECT 'active' AS kind, workload, count(*)::int AS n, NULL AS id, NULL AS owner, NULL::float8 AS seq
        FROM ${s}.concurrency_leases, now WHERE limiter = $1::text AND expires_at > now.t GROUP BY workload
      UNION ALL
      SELECT 'queued', workload, count(*)::int, NULL, NULL, NULL FROM live GROUP BY workload
      UNION ALL
      SELECT 'head', workload, NULL, id::text, owner, seq::float8 FROM (
        SELECT id, workload, owner, seq, row_number() OVER (PARTITION BY workload ORDER BY seq) AS rn FROM live) h
        WHERE rn <= $3::int
      UNION ALL
      SELECT 'offer', workload, NULL, id::text, waiter_id::text, NULL FROM ${s}.concurrency_leases, now
        WHERE waiter_id = ANY($4::uuid[]) AND offered AND expires_at > now.t
      UNION ALL
      SELECT 'now', NULL, NULL, NULL, NULL, ${ms('now.t')} FROM now`,

    // Writes the grants of one pass. $2..$5 describe the grants: waiter, workload, owner, and
    // whether the waiter is in this process (a direct grant, valid for the lease TTL) or in
    // another one (an offer, valid for the offer TTL, announced by NOTIFY). $6 lists queue
    // entries to drop without a grant (queue full, no wait allowed).
    grant: `WITH g AS (
        SELECT * FROM unnest($2::uuid[], $3::text[], $4::text[], $5::boolean[]) AS g(waiter_id, workload, owner, direct)),
        dropped AS (DELETE FROM ${s}.concurrency_waiters
          WHERE id IN (SELECT waiter_id FROM g) OR id = ANY($6::uuid[])),
        ins AS (INSERT INTO ${s}.concurrency_leases (limiter, workload, fence, owner, offered, waiter_id, acquired_at, expires_at)
          SELECT $1::text, g.workload, nextval('${s}.concurrency_fence'), g.owner, NOT g.direct, g.waiter_id,
            clock_timestamp(),
            clock_timestamp() + (CASE WHEN g.direct THEN $7::float8 ELSE $8::float8 END) * interval '1 millisecond'
          FROM g
          RETURNING *)
      SELECT ${leaseColumns},
        CASE WHEN offered THEN pg_notify($9::text || owner,
          json_build_object('l', limiter, 'w', waiter_id, 'id', id)::text) END AS notified
      FROM ins`,

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
