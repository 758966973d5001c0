import type { Database, SqlClient } from '@sluice/postgres/database';
import { settingDefaults } from '../settings.js';
import { lockThread, threadHeld, threadLeaseMs as leaseFor } from '../threads/store.js';
import { hasRoom, highestFitting } from './caps.js';
import { claimByTurn, currentTurn } from './claim-turns.js';
import { deferredLock, startFirstDeferred, startRun } from './lifecycle.js';
import type { RunClass } from './states.js';
import type { RunRow } from './store.js';

/** The thread lease a claim takes when its caller names none: the settings' default. */
const defaultThreadLeaseMs = leaseFor(settingDefaults);

/**
 * How queue workers take their next run. SKIP LOCKED keeps workers of every process apart. A
 * run of a thread is taken only with its thread: when the thread is held (or a run of it was
 * queued earlier) the run keeps its place and the claim moves on to the next one. A resumed
 * run holds its thread already: it kept it while paused.
 *
 * Runs are taken in admission order (the default class: within each tenant, the tenants taking
 * turns): `seq`, compared as the number it is. (Selected as text for the thread lock, it must
 * not be what the query sorts by: '10' sorts before '2'.)
 */

/**
 * Whether any run of `runClass` is queued, by the class's partial queue index (the class is
 * spelled in the statement so that the planner can use it): an idle worker's poll asks this
 * one statement before it opens a claim's transaction.
 */
export async function anyQueued(db: Database, runClass: RunClass): Promise<boolean> {
  const { rows } = await db.query<{ any: boolean }>(anyQueuedSql[runClass]);
  return rows[0]!.any;
}

const anyQueuedSql: Readonly<Record<RunClass, string>> = {
  default: `SELECT EXISTS (SELECT 1 FROM agent_runs WHERE status = 'queued' AND class = 'default') AS any`,
  deferred: `SELECT EXISTS (SELECT 1 FROM agent_runs WHERE status = 'queued' AND class = 'deferred') AS any`,
};

/**
 * A queued run that may go now as far as its thread is concerned (none, or free for it), its
 * thread not among those found busy (`busy`, SQL of a text array; null when none was).
 */
const threadAllowsOf = (busy: string | null) => `(r.thread_id IS NULL OR (${
  busy === null ? '' : `NOT (r.thread_id = ANY(${busy})) AND`
}
  NOT EXISTS (SELECT 1 FROM agent_runs q WHERE q.thread_id = r.thread_id AND q.status = 'queued' AND q.seq < r.seq)
  AND NOT EXISTS (SELECT 1 FROM threads t WHERE t.id = r.thread_id AND t.active_run_id IS DISTINCT FROM r.id
                  AND ${threadHeld('t')})))`;
const threadAllows = threadAllowsOf('$1::text[]');

interface Candidate {
  id: string;
  tenant: string;
  thread_id: string | null;
  seq: string;
}

/**
 * Marks a candidate running for `worker`, taking its thread first. Returns the thread's id
 * instead when another run got the thread in the meantime.
 */
async function start(
  tx: SqlClient,
  candidate: Candidate,
  worker: string,
  threadLeaseMs: number,
): Promise<RunRow | { busyThread: string }> {
  if (candidate.thread_id !== null) {
    const lock = await lockThread(
      tx,
      { id: candidate.thread_id, tenant: candidate.tenant },
      candidate.id,
      threadLeaseMs,
      candidate.seq,
    );
    if (!lock.ok) return { busyThread: candidate.thread_id };
  }
  return (await startRun(tx, candidate.id, worker))!;
}

/**
 * Takes the next queued default-class run that may go now: the tenants take turns
 * (./claim-turns.ts), and a tenant's oldest run goes first.
 */
export async function claimDefaultRun(
  db: Database,
  worker: string,
  threadLeaseMs = defaultThreadLeaseMs,
): Promise<RunRow | undefined> {
  const busyThreads: string[] = [];
  return claimByTurn<Candidate & { turn: string | null }>(db, {
    candidate: async (tx, tenant) =>
      (
        await tx.query<Candidate & { turn: string | null }>(
          `SELECT id, tenant, thread_id, seq::text AS seq, ${currentTurn('$2')} FROM agent_runs r
           WHERE status = 'queued' AND class = 'default' AND tenant = $2::text AND ${threadAllows}
           ORDER BY r.seq FOR UPDATE SKIP LOCKED LIMIT 1`,
          [busyThreads, tenant],
        )
      ).rows[0],
    take: async (tx, candidate) => {
      const started = await start(tx, candidate, worker, threadLeaseMs);
      if (!('busyThread' in started)) return started;
      busyThreads.push(started.busyThread);
      return 'retry';
    },
  });
}

/** Locks the counters rows of a run's tenant and project, tenant first (as the trigger does). */
async function lockCounters(tx: SqlClient, runId: string): Promise<void> {
  await tx.query(
    `SELECT 1 FROM admission_counters c, agent_runs r
     WHERE r.id = $1::text AND c.tenant = r.tenant AND c.project IN ('', r.project)
     ORDER BY c.project FOR UPDATE OF c`,
    [runId],
  );
}

/**
 * The oldest queued deferred run a claim may take, locked (SKIP LOCKED): not of a thread found
 * busy (`busy`) nor of a tenant found full (`full`), each SQL of a text array or null when none
 * was. Capped (`highest`: SQL of the highest running count at which one more fits), a tenant
 * whose running count (`admission_counters`) is past it is left out.
 */
const deferredCandidate = (busy: string | null, full: string | null, highest: string | null) => `
  SELECT id, tenant, thread_id FROM agent_runs r
  WHERE status = 'queued' AND class = 'deferred' ${full === null ? '' : `AND NOT (tenant = ANY(${full}))`}
    ${
      highest !== null
        ? `AND NOT EXISTS (SELECT 1 FROM admission_counters c
                           WHERE c.tenant = r.tenant AND c.project = '' AND c.deferred_running > ${highest})`
        : ''
    }
    AND ${threadAllowsOf(busy)}
  ORDER BY r.seq FOR UPDATE SKIP LOCKED LIMIT 1`;
// A retry, with threads found busy ($1) and tenants found full ($2); capped, $3 is the highest.
const cappedCandidate = deferredCandidate('$1::text[]', '$2::text[]', '$3::int');
const uncappedCandidate = deferredCandidate('$1::text[]', '$2::text[]', null);
/**
 * A claim's first try: nothing found busy or full yet, and the cap written in the text. Its only
 * parameter is the worker, so the plan PostgreSQL keeps for the prepared statement is the one
 * it would make each time (with the arrays and the cap as parameters it kept planning anew,
 * 2 to 3 ms a claim in bench:queues). One text per cap in use.
 */
const firstCandidates = new Map<number | null, string>();
function firstCandidate(highest: number | null): string {
  let text = firstCandidates.get(highest);
  if (text === undefined) {
    if (highest !== null && !Number.isSafeInteger(highest))
      throw new TypeError(`Expected a cap, got ${highest}`);
    text = deferredCandidate(null, null, highest === null ? null : String(highest));
    firstCandidates.set(highest, text);
  }
  return text;
}

/**
 * Takes the oldest queued deferred run of a tenant under its running cap. The transaction
 * below (BEGIN, pick, start, COMMIT for a run without a thread) goes like this:
 * - the pick leaves out tenants at their cap (counted in the same statement), so however many
 *   of them have older runs, a tenant with room is reached; it locks the candidate's row
 *   (SKIP LOCKED keeps workers of every process apart) and then takes the tenant's advisory
 *   lock (held to the end of the transaction);
 * - the start counts the tenant's running deferred runs again and marks the candidate running
 *   only when it has room. Under READ COMMITTED that statement reads what committed before it
 *   began, after the lock was granted: every claim of the tenant that held the lock before has
 *   committed by then, so workers on any process never run more than the cap for one tenant.
 * A candidate of a thread takes the count, then its thread, then the start (claims.ts `start`).
 * A tenant found full is left out of the next try; a busy thread too.
 *
 * Each try first goes the short way (lifecycle.ts `startFirstDeferred`, one statement): a run without a thread
 * whose tenant has room is started there. The transaction is for a candidate of a thread and
 * for a tenant that filled up between the pick and the lock.
 */
export async function claimDeferredRun(
  db: Database,
  worker: string,
  maxRunningPerTenant: number,
  threadLeaseMs = defaultThreadLeaseMs,
): Promise<RunRow | undefined> {
  const capped = maxRunningPerTenant > 0;
  // The most running runs at which one more still fits (caps.ts).
  const highest = highestFitting(maxRunningPerTenant, 1);
  const atCap: string[] = [];
  const busyThreads: string[] = [];
  for (;;) {
    const first = busyThreads.length === 0 && atCap.length === 0;
    const quick = first
      ? await startFirstDeferred(
          db,
          firstCandidate(highest),
          highest === null ? null : String(highest),
          [],
          worker,
        )
      : await startFirstDeferred(
          db,
          capped ? cappedCandidate : uncappedCandidate,
          capped ? '$3::int' : null,
          capped ? [busyThreads, atCap, highest] : [busyThreads, atCap],
          worker,
        );
    if (quick === undefined) return undefined;
    if (quick.run !== undefined) return quick.run;
    const claimed = await db.transaction(async (tx) => {
      const candidate = (
        await tx.query<Candidate>(
          capped
            ? `WITH full_tenants AS MATERIALIZED (
                 SELECT tenant FROM agent_runs WHERE status = 'running' AND class = 'deferred'
                 GROUP BY tenant HAVING count(*) > $3::int),
               picked AS MATERIALIZED (
                 SELECT id, tenant, thread_id, seq::text AS seq FROM agent_runs r
                 WHERE status = 'queued' AND class = 'deferred' AND NOT (tenant = ANY($2::text[]))
                   AND NOT EXISTS (SELECT 1 FROM full_tenants f WHERE f.tenant = r.tenant) AND ${threadAllows}
                 ORDER BY r.seq FOR UPDATE SKIP LOCKED LIMIT 1)
               SELECT id, tenant, thread_id, seq, pg_advisory_xact_lock(${deferredLock('tenant')}) IS NULL AS locked
               FROM picked`
            : `SELECT id, tenant, thread_id, seq::text AS seq FROM agent_runs r
               WHERE status = 'queued' AND class = 'deferred' AND ${threadAllows}
               ORDER BY r.seq FOR UPDATE SKIP LOCKED LIMIT 1`,
          capped ? [busyThreads, atCap, highest] : [busyThreads],
        )
      ).rows[0];
      if (!candidate) return undefined;
      // A run of a thread: the tenant's counters rows before its thread, the order in which a
      // deferred run's end takes them (its counts change, then its thread is let go).
      if (candidate.thread_id !== null) await lockCounters(tx, candidate.id);
      if (!capped) return start(tx, candidate, worker, threadLeaseMs);
      if (candidate.thread_id === null) {
        const room = { tenant: candidate.tenant, highest: highest! };
        return (await startRun(tx, candidate.id, worker, room)) ?? { fullTenant: candidate.tenant };
      }
      const running = (
        await tx.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1::text AND class = 'deferred' AND status = 'running'`,
          [candidate.tenant],
        )
      ).rows[0]!.n;
      if (!hasRoom(running, maxRunningPerTenant)) return { fullTenant: candidate.tenant };
      return start(tx, candidate, worker, threadLeaseMs);
    });
    if (claimed === undefined) return undefined;
    if ('fullTenant' in claimed) atCap.push(claimed.fullTenant);
    else if ('busyThread' in claimed) busyThreads.push(claimed.busyThread);
    else return claimed;
  }
}
