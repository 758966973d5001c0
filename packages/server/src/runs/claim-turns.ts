import type { Database, SqlClient } from '@sluice/postgres/database';
import type { RunRow } from './store.js';

/**
 * Round-robin by tenant for the default-class queue (sql/020_claim_turns.sql). Each claim serves
 * the waiting tenant whose last claim is oldest (one never served first, by its oldest run), so a
 * tenant with a long queue puts at most one run ahead of another tenant's next.
 *
 * Claimers on every process agree on whose turn it is: the tenant is taken under a try-lock of
 * its own (a claimer that finds it taken moves on to the next tenant, so claimers work side by
 * side), and its turn is read again once the lock is held. A turn that moved since the order was
 * read means another claimer served the tenant meanwhile: the claim starts over rather than
 * serving the same tenant twice in a row.
 */

/** The try-lock (or lock) on a tenant's turn; held until the claim's transaction ends. */
const turnLock = (tenant: string) => `hashtext('sluice:claim:default:' || ${tenant})`;

/**
 * The first waiting tenant in turn order, not in `$1`, meeting `condition`. The tenants are read
 * off the queue index one at a time, each with its oldest run (a probe per waiting tenant, not a
 * row per run). A volatile condition (the try-lock) is not pushed below the sort: it is tried in
 * turn order and stops at the first tenant it holds.
 */
const firstWaiting = (condition: string) => `
  WITH RECURSIVE heads(tenant, seq) AS (
    (SELECT tenant, seq FROM agent_runs WHERE status = 'queued' AND class = 'default' ORDER BY tenant, seq LIMIT 1)
    UNION ALL
    SELECT n.tenant, n.seq FROM heads h CROSS JOIN LATERAL (
      SELECT tenant, seq FROM agent_runs WHERE status = 'queued' AND class = 'default' AND tenant > h.tenant
      ORDER BY tenant, seq LIMIT 1) n
  )
  SELECT o.tenant, o.turn FROM (
    SELECT h.tenant, c.turn::text AS turn FROM heads h
    LEFT JOIN claim_turns c ON c.class = 'default' AND c.tenant = h.tenant
    WHERE NOT (h.tenant = ANY($1::text[]))
    ORDER BY c.turn NULLS FIRST, h.seq
  ) o
  WHERE ${condition}
  LIMIT 1`;

const nextFree = firstWaiting(`pg_try_advisory_xact_lock(${turnLock('o.tenant')})`);
const nextAny = firstWaiting('true');

interface Waiting {
  tenant: string;
  turn: string | null;
}

/**
 * The tenant to claim for, its turn lock held. When every waiting tenant is being claimed for
 * by someone else, the claim waits for the first one's lock rather than report an empty queue
 * (one tenant's many runs must not leave all but one worker idle).
 */
async function lockNext(tx: SqlClient, passed: string[]): Promise<Waiting | undefined> {
  const free = (await tx.query<Waiting>(nextFree, [passed])).rows[0];
  if (free !== undefined) return free;
  const busy = (await tx.query<Waiting>(nextAny, [passed])).rows[0];
  if (busy !== undefined)
    await tx.query(`SELECT pg_advisory_xact_lock(${turnLock('$1::text')})`, [busy.tenant]);
  return busy;
}

/**
 * The tenant's turn as the lock's last holder left it, for the candidate query to select beside
 * the run: a statement after the one that took the lock sees what that holder committed.
 */
export const currentTurn = (tenantParam: string) =>
  `(SELECT turn::text FROM claim_turns WHERE class = 'default' AND tenant = ${tenantParam}::text) AS turn`;

/** What a claim does with a tenant: find its run (locked), then take it or pass for now. */
export interface TurnClaim<C extends { turn: string | null }> {
  /** The tenant's next run, selected with {@link currentTurn}. */
  candidate(tx: SqlClient, tenant: string): Promise<C | undefined>;
  /** Starts the candidate, or `retry` to look at the tenant again. */
  take(tx: SqlClient, candidate: C): Promise<RunRow | 'retry'>;
}

/** What one try gave: a run, nothing left to try, or a tenant to pass over, or start over. */
type Attempt = RunRow | undefined | { pass: string } | 'stale' | 'retry';

/** Claims for the tenant whose turn it is; undefined when no waiting tenant has a run to give. */
export async function claimByTurn<C extends { turn: string | null }>(
  db: Database,
  claim: TurnClaim<C>,
): Promise<RunRow | undefined> {
  const passed: string[] = [];
  for (;;) {
    const attempt = await db.transaction(async (tx): Promise<Attempt> => {
      const waiting = await lockNext(tx, passed);
      if (waiting === undefined) return undefined;
      const candidate = await claim.candidate(tx, waiting.tenant);
      if (candidate === undefined) return { pass: waiting.tenant };
      if (candidate.turn !== waiting.turn) return 'stale';
      const taken = await claim.take(tx, candidate);
      if (taken === 'retry') return taken;
      await tx.query(
        `INSERT INTO claim_turns (class, tenant, turn) VALUES ('default', $1::text, nextval('claim_turn_seq'))
         ON CONFLICT (class, tenant) DO UPDATE SET turn = EXCLUDED.turn`,
        [waiting.tenant],
      );
      return taken;
    });
    if (attempt === undefined || (typeof attempt === 'object' && !('pass' in attempt))) return attempt;
    if (typeof attempt === 'object') passed.push(attempt.pass);
  }
}
