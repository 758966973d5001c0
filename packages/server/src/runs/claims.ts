import type { Database, SqlClient } from '@sluice/postgres/database';
import { settingDefaults } from '../settings.js';
import { lockThread, threadHeld, threadLeaseMs as leaseFor } from '../threads/store.js';
import { hasRoom } from './caps.js';
import { claimByTurn, currentTurn } from './claim-turns.js';
import { startRun } from './lifecycle.js';
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

/** A queued run that may go now as far as its thread is concerned (none, or free for it). */
const threadAllows = `(r.thread_id IS NULL OR (NOT (r.thread_id = ANY($1::text[]))
  AND NOT EXISTS (SELECT 1 FROM agent_runs q WHERE q.thread_id = r.thread_id AND q.status = 'queued' AND q.seq < r.seq)
  AND NOT EXISTS (SELECT 1 FROM threads t WHERE t.id = r.thread_id AND t.active_run_id IS DISTINCT FROM r.id
                  AND ${threadHeld('t')})))`;

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
  return startRun(tx, candidate.id, worker);
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

/**
 * Takes the oldest queued deferred run of a tenant under its running cap. Tenants at their cap
 * are left out inside the query, so however many of them have older runs, a tenant with room
 * is reached. The count is taken again under the tenant's advisory lock before the claim, so
 * workers on any process never run more than the cap for one tenant.
 */
export async function claimDeferredRun(
  db: Database,
  worker: string,
  maxRunningPerTenant: number,
  threadLeaseMs = defaultThreadLeaseMs,
): Promise<RunRow | undefined> {
  // Tenants at their cap, counted once per claim (running deferred runs are few: at most the
  // workers of all processes). Another claimer can fill a tenant meanwhile; the count under the
  // tenant's lock below catches that, and the tenant is left out of the next try.
  const atCap =
    maxRunningPerTenant > 0
      ? (
          await db.query<{ tenant: string; n: number }>(
            `SELECT tenant, count(*)::int AS n FROM agent_runs WHERE status = 'running' AND class = 'deferred'
             GROUP BY tenant`,
          )
        ).rows
          .filter((r) => !hasRoom(r.n, maxRunningPerTenant))
          .map((r) => r.tenant)
      : [];
  const busyThreads: string[] = [];
  for (;;) {
    const claimed = await db.transaction(async (tx) => {
      const candidate = (
        await tx.query<Candidate>(
          `SELECT id, tenant, thread_id, seq::text AS seq FROM agent_runs r
           WHERE status = 'queued' AND class = 'deferred' AND NOT (tenant = ANY($2::text[])) AND ${threadAllows}
           ORDER BY r.seq FOR UPDATE SKIP LOCKED LIMIT 1`,
          [busyThreads, atCap],
        )
      ).rows[0];
      if (!candidate) return undefined;
      if (maxRunningPerTenant > 0) {
        await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [
          `sluice:deferred:${candidate.tenant}`,
        ]);
        const running = (
          await tx.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1::text AND class = 'deferred' AND status = 'running'`,
            [candidate.tenant],
          )
        ).rows[0]!.n;
        if (!hasRoom(running, maxRunningPerTenant)) return { fullTenant: candidate.tenant };
      }
      return start(tx, candidate, worker, threadLeaseMs);
    });
    if (claimed === undefined) return undefined;
    if ('fullTenant' in claimed) atCap.push(claimed.fullTenant);
    else if ('busyThread' in claimed) busyThreads.push(claimed.busyThread);
    else return claimed;
  }
}
