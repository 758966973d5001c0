import type { Database, SqlClient } from '@sluice/postgres/database';
import { toJsonb } from '../runs/json.js';
import type { Principal } from '../store/tokens.js';
import { randomId } from '../store/ids.js';

/**
 * Every SQL statement about threads. A thread's lock is a lease on its row: `active_run_id`
 * holds it until `lock_expires_at`. It is free when nobody holds it, when the lease ran out (a
 * crashed process stops renewing), or when the holder reached a final state (a trigger frees it
 * then, and this reading covers a trigger-less moment too). Queued runs of a thread are served
 * in admission order: a run waiting to hold the thread never jumps ahead of one queued before it.
 */

/**
 * How long a thread stays held after its holder's process last renewed it (every heartbeat):
 * three stale times, so a crashed holder's thread is free a little after its runs are lost.
 */
export const threadLeaseMs = (settings: { nodeStaleMs: number }) => 3 * settings.nodeStaleMs;

export type ThreadStatus = 'idle' | 'busy' | 'requires_action';

export interface ThreadRow {
  id: string;
  tenant: string;
  metadata: unknown;
  created_at: number;
  status: ThreadStatus;
  active_run_id: string | null;
}

export interface ThreadMessageRow {
  role: 'user' | 'assistant' | 'system';
  content: unknown;
  run_id: string | null;
  created_at: number;
}

const threadIdPattern = /^thr_[0-9a-f]{24}$/;
/** Ids are ours: anything else names no thread, and costs no query. */
export const isThreadId = (id: string) => threadIdPattern.test(id);

/** The holder of a thread still counts: it is not final and its lease has not run out. */
export const threadHeld = (
  t: string,
) => `(${t}.active_run_id IS NOT NULL AND ${t}.lock_expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM agent_runs h WHERE h.id = ${t}.active_run_id
                  AND h.status IN ('succeeded', 'failed', 'canceled')))`;

const columns = `t.id, t.tenant, t.metadata, (extract(epoch FROM t.created_at))::float8 AS created_at,
  CASE WHEN NOT ${threadHeld('t')} THEN NULL ELSE t.active_run_id END AS active_run_id,
  CASE WHEN NOT ${threadHeld('t')} THEN 'idle'
       WHEN EXISTS (SELECT 1 FROM agent_runs a WHERE a.id = t.active_run_id AND a.status = 'requires_action')
         THEN 'requires_action'
       ELSE 'busy' END AS status`;

export function toApiThread(thread: ThreadRow) {
  return {
    id: thread.id,
    object: 'thread',
    status: thread.status,
    created_at: Math.floor(thread.created_at),
    metadata: thread.metadata ?? {},
  };
}

export async function createThread(db: Database, who: Principal, metadata: unknown): Promise<ThreadRow> {
  const id = randomId('thr_', 12);
  return (
    await db.query<ThreadRow>(
      `WITH t AS (INSERT INTO threads (id, tenant, project, user_id, metadata)
                  VALUES ($1::text, $2::text, $3::text, $4::text, $5::jsonb) RETURNING *)
       SELECT ${columns} FROM t`,
      [id, who.tenant, who.project, who.user, toJsonb(metadata ?? {})],
    )
  ).rows[0]!;
}

export async function getThread(db: SqlClient, tenant: string, id: string): Promise<ThreadRow | undefined> {
  if (!isThreadId(id)) return undefined;
  return (
    await db.query<ThreadRow>(
      `SELECT ${columns} FROM threads t WHERE t.id = $1::text AND t.tenant = $2::text`,
      [id, tenant],
    )
  ).rows[0];
}

/**
 * A page of a thread's messages, oldest first, after the first `offset` of them. Messages are
 * only ever appended, so a position in the thread is a stable cursor, and it says nothing about
 * other threads (a global sequence number would).
 */
export async function listMessages(
  db: Database,
  threadId: string,
  page: { limit: number; offset: number },
): Promise<ThreadMessageRow[]> {
  return (
    await db.query<ThreadMessageRow>(
      `SELECT m.role, m.content, m.run_id, (extract(epoch FROM m.created_at))::float8 AS created_at
       FROM thread_messages m WHERE m.thread_id = $1::text
       ORDER BY m.seq OFFSET $2::int LIMIT $3::int`,
      [threadId, page.offset, page.limit],
    )
  ).rows;
}

/** The conversation a run of the thread continues: its latest `max` messages, oldest first. */
export async function historyOf(
  db: SqlClient,
  threadId: string,
  max = 10_000,
): Promise<{ role: 'user' | 'assistant' | 'system'; content: unknown }[]> {
  return (
    await db.query<{ role: 'user' | 'assistant' | 'system'; content: unknown }>(
      `SELECT role, content FROM (SELECT m.seq, m.role, m.content FROM thread_messages m WHERE m.thread_id = $1::text
                                  ORDER BY m.seq DESC LIMIT $2::int) last ORDER BY last.seq`,
      [threadId, max],
    )
  ).rows;
}

export type LockAttempt =
  | { ok: true }
  | { ok: false; activeRunId: string | null }
  | { ok: false; missing: true }
  /** The process began draining while the caller waited. */
  | { ok: false; closed: true }
  /** `onBusy: 'cancel'`, but the caller may not cancel the active run (named). */
  | { ok: false; forbidden: string };

/**
 * Takes a tenant's thread for `runId` (or renews it, when `runId` holds it already), unless
 * another run holds it or runs of the thread are queued before it (`beforeSeq`: the seq of the
 * run taking it; none for a run not admitted yet, which comes after every queued one).
 */
export async function lockThread(
  db: SqlClient,
  thread: { id: string; tenant: string },
  runId: string,
  leaseMs: number,
  beforeSeq?: string,
): Promise<LockAttempt> {
  const taken = await db.query<{ id: string }>(
    `UPDATE threads t SET active_run_id = $3::text, lock_expires_at = clock_timestamp() + $4::float8 * interval '1 millisecond'
     WHERE t.id = $1::text AND t.tenant = $2::text AND (t.active_run_id = $3::text OR NOT ${threadHeld('t')})
       AND NOT EXISTS (SELECT 1 FROM agent_runs q WHERE q.thread_id = t.id AND q.status = 'queued' AND q.id <> $3::text
                       AND ($5::bigint IS NULL OR q.seq < $5::bigint))
     RETURNING t.id`,
    [thread.id, thread.tenant, runId, leaseMs, beforeSeq ?? null],
  );
  if (taken.rows.length > 0) return { ok: true };
  const now = await getThread(db, thread.tenant, thread.id);
  if (!now) return { ok: false, missing: true };
  return { ok: false, activeRunId: now.active_run_id };
}

/** Gives a thread back that `runId` took but never used (its admission was refused). */
export async function unlockThread(db: Database, threadId: string, runId: string): Promise<void> {
  await db.query(
    `WITH freed AS (UPDATE threads SET active_run_id = NULL, lock_expires_at = NULL
                    WHERE id = $1::text AND active_run_id = $2::text RETURNING id)
     SELECT pg_notify('sluice_runs', 'thread:' || id) FROM freed`,
    [threadId, runId],
  );
}

/**
 * A thread a front created for the request it is submitting (AG-UI's first use of a client's
 * thread id, a Responses chain's first follow-up): `seededFrom` is the run it was seeded from,
 * which names it as its thread from then on.
 */
export interface NewThread {
  id: string;
  seededFrom?: string;
}

/**
 * Removes a thread that was created for a request which was then refused, so that a refused
 * request leaves no row behind. Only while nothing has used it since: no run of it (the run it
 * was seeded from aside, which goes back to having no thread) and no holder of its lock (a
 * concurrent request being admitted on it). Its messages go with it. True when it was removed.
 *
 * The row is locked first and the runs are looked for in a statement after that lock: a run
 * admitted on the thread meanwhile by another request that found it (whose insert the lock's
 * snapshot may not see) is seen by then, or that request sees the thread gone when it looks
 * after its admission (`keepOpenedThread`, which waits for this lock) and moves its run.
 */
export async function dropNewThread(db: Database, thread: NewThread): Promise<boolean> {
  return db.transaction(async (tx) => {
    const locked = await tx.query<{ id: string }>('SELECT id FROM threads WHERE id = $1::text FOR UPDATE', [
      thread.id,
    ]);
    if (locked.rows.length === 0) return false;
    const { rows } = await tx.query<{ n: number }>(
      `WITH gone AS (
         DELETE FROM threads t
         WHERE t.id = $1::text AND t.active_run_id IS NULL
           AND NOT EXISTS (SELECT 1 FROM agent_runs r WHERE r.thread_id = t.id AND r.id IS DISTINCT FROM $2::text)
         RETURNING t.id),
       unseeded AS (
         UPDATE agent_runs SET thread_id = NULL
         WHERE id = $2::text AND thread_id IN (SELECT id FROM gone) RETURNING id)
       SELECT count(*)::int AS n FROM gone`,
      [thread.id, thread.seededFrom ?? null],
    );
    return (rows[0]?.n ?? 0) > 0;
  });
}

/**
 * After a queued run was admitted on a thread its request found made by another request (which
 * removes it if it is refused, see `dropNewThread`): whether the thread is still there, waiting
 * for a removal under way. When it is gone, the run is moved to the thread `reopen` opens (a
 * queued run of a missing thread is never claimed). Returns the thread the run is on.
 */
export async function keepOpenedThread(
  db: Database,
  runId: string,
  threadId: string,
  reopen: () => Promise<{ id: string } | undefined>,
): Promise<string | undefined> {
  const there = await db.query('SELECT id FROM threads WHERE id = $1::text FOR SHARE', [threadId]);
  if (there.rows.length > 0) return threadId;
  const again = await reopen();
  await db.query(
    `UPDATE agent_runs SET thread_id = $3::text WHERE id = $1::text AND thread_id = $2::text AND status = 'queued'`,
    [runId, threadId, again?.id ?? null],
  );
  return again?.id;
}

/** Renews the leases of the threads held by runs this process executes. */
export async function renewThreadLeases(db: Database, runIds: string[], leaseMs: number): Promise<void> {
  if (runIds.length === 0) return;
  await db.query(
    `UPDATE threads SET lock_expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
     WHERE active_run_id = ANY($1::text[])`,
    [runIds, leaseMs],
  );
}

/** The messages a successful run adds to its thread: its input, then its answer. */
export function newThreadMessages(input: unknown, answer: string): { role: string; content: unknown }[] {
  const given =
    typeof input === 'string'
      ? [{ role: 'user', content: input }]
      : Array.isArray(input)
        ? (input as { role: string; content: unknown }[]).map((m) => ({ role: m.role, content: m.content }))
        : [];
  return [...given, { role: 'assistant', content: answer }];
}
