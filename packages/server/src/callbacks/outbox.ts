import type { SqlClient } from '@sluice/postgres/database';

/**
 * The outbox queries (table and trigger: sql/010_callback_outbox.sql). Every time in them is
 * `now`: an injected clock's epoch ms, or NULL for the database's clock, so processes on
 * different hosts agree on due times and leases, and tests can drive both with a ManualClock.
 * A lease is the row's next_attempt_at moved past the attempt: a claim needs no second
 * column, and a crashed process's rows fall due again on their own.
 */

export interface ClaimedDelivery {
  id: string;
  run_id: string;
  tenant: string;
  url: string;
  attempts: number;
}

// Epoch plus whole milliseconds is exact in microseconds; to_timestamp(ms / 1000) goes through
// a fractional float and can land a microsecond off, so a row due "now" would not be.
const now = (n: number) =>
  `coalesce('epoch'::timestamptz + $${n}::float8 * interval '1 millisecond', clock_timestamp())`;

/**
 * Takes up to `limit` due rows for one lease. SKIP LOCKED lets several processes claim at
 * once without waiting on each other or taking the same row; one statement is one short
 * transaction, and the attempts happen after it has committed.
 */
export async function claimDue(
  db: SqlClient,
  claim: { limit: number; lease: string; leaseMs: number; now: number | null },
): Promise<ClaimedDelivery[]> {
  const result = await db.query<ClaimedDelivery>(
    `WITH due AS (
       SELECT id FROM callback_deliveries
       WHERE state = 'pending' AND next_attempt_at <= ${now(1)}
       ORDER BY next_attempt_at, created_at
       LIMIT $2::int
       FOR UPDATE SKIP LOCKED)
     UPDATE callback_deliveries d
     SET next_attempt_at = ${now(1)} + $3::float8 * interval '1 millisecond', lease = $4::text,
         attempts = d.attempts + 1
     FROM due WHERE d.id = due.id
     RETURNING d.id, d.run_id, d.tenant, d.url, d.attempts`,
    [claim.now, claim.limit, claim.leaseMs, claim.lease],
  );
  return result.rows;
}

/**
 * Milliseconds until the next pending row falls due (0 when one is due now), or null when
 * none is pending. CASE, because '-infinity' minus a time is an error, not an interval.
 */
export async function nextDueInMs(db: SqlClient, at: number | null): Promise<number | null> {
  const result = await db.query<{ ms: number | null }>(
    `SELECT CASE WHEN min(next_attempt_at) <= ${now(1)} THEN 0
                 ELSE extract(epoch FROM min(next_attempt_at) - ${now(1)}) * 1000 END::float8 AS ms
     FROM callback_deliveries WHERE state = 'pending'`,
    [at],
  );
  return result.rows[0]?.ms ?? null;
}

/**
 * Ends a delivery: delivered or failed. Only the claim that holds the row records: after a
 * lease lapsed and another process took the row, a late outcome here changes nothing.
 */
export async function recordFinal(
  db: SqlClient,
  outcome: {
    id: string;
    lease: string;
    state: 'delivered' | 'failed';
    status: number | null;
    error: string | null;
    now: number | null;
  },
): Promise<boolean> {
  const result = await db.query(
    `UPDATE callback_deliveries
     SET state = $4::text, lease = NULL, last_status = $5::int, last_error = $6::text, finished_at = ${now(1)}
     WHERE id = $2::text AND lease = $3::text AND state = 'pending'
     RETURNING id`,
    [outcome.now, outcome.id, outcome.lease, outcome.state, outcome.status, outcome.error],
  );
  return result.rows.length > 0;
}

/**
 * Schedules the next attempt `delayMs` from now, or ends the row `dead` when that would fall
 * after `maxAgeMs` from its creation (when the run ended). Returns the new state, or
 * undefined when this claim no longer holds the row.
 */
export async function recordRetry(
  db: SqlClient,
  outcome: {
    id: string;
    lease: string;
    status: number | null;
    error: string;
    delayMs: number;
    maxAgeMs: number;
    now: number | null;
  },
): Promise<'pending' | 'dead' | undefined> {
  // Expressions in SET read the row as it was, so created_at and the new time line up.
  const next = `${now(1)} + $6::float8 * interval '1 millisecond'`;
  const tooLate = `${next} > created_at + $7::float8 * interval '1 millisecond'`;
  const result = await db.query<{ state: 'pending' | 'dead' }>(
    `UPDATE callback_deliveries
     SET lease = NULL, last_status = $4::int, last_error = $5::text, next_attempt_at = ${next},
         state = CASE WHEN ${tooLate} THEN 'dead' ELSE 'pending' END,
         finished_at = CASE WHEN ${tooLate} THEN ${now(1)} END
     WHERE id = $2::text AND lease = $3::text AND state = 'pending'
     RETURNING state`,
    [
      outcome.now,
      outcome.id,
      outcome.lease,
      outcome.status,
      outcome.error,
      outcome.delayMs,
      outcome.maxAgeMs,
    ],
  );
  return result.rows[0]?.state;
}

/** Hands back rows claimed under `lease` and never attempted (the dispatcher stopped meanwhile). */
export async function releaseClaim(
  db: SqlClient,
  claim: { lease: string; now: number | null },
): Promise<void> {
  await db.query(
    `UPDATE callback_deliveries SET lease = NULL, next_attempt_at = ${now(1)}, attempts = attempts - 1
     WHERE lease = $2::text AND state = 'pending'`,
    [claim.now, claim.lease],
  );
}
