import type { Database, SqlClient } from '@sluice/postgres/database';
import { systemClock, type Clock } from 'sluice/concurrency';
import { full, type RunRow } from './store.js';

/*
 * An admission sent as one statement on its own (sluice_admit, sql/034_admission_alone.sql)
 * commits on the server whether or not its answer comes back. When the answer is lost (the
 * connection cut or gone silent), the caller must learn what the statement did before it
 * answers: told "failed", a client tries again, and a run written meanwhile would run twice.
 *
 * So the batch is fenced, then read under its own lock: a statement that had not passed its
 * fence check writes nothing, ever; one that had holds the batch's lock until it ends, so the
 * read waits for it. The fence and the read are tried again while the database cannot be
 * reached, until the statement's own bounds have surely ended it: its lock waits, and the
 * statement timeout the store sets.
 */

/** Time past the lock wait given to the statement before its outcome is called unknown. */
export const SETTLE_MARGIN_MS = 2_000;

/**
 * The admission's answer was lost and the database could not be asked in time: the runs `ids`
 * may or may not exist (HTTP 503 `admission_outcome_unknown`, with their ids to look up).
 */
export class AdmissionOutcomeUnknown extends Error {
  constructor(
    readonly lost: unknown,
    readonly ids: string[],
  ) {
    super(`an admission's answer was lost and its outcome could not be read: ${String(lost)}`, {
      cause: lost,
    });
    this.name = 'AdmissionOutcomeUnknown';
  }
}

// Errors raised before a statement leaves the process: nothing to settle.
const neverSent = [
  /^timeout exceeded when trying to connect$/,
  /pool after calling end/,
  /Client was closed/,
  /Client has encountered a connection error and is not queryable/,
];

/**
 * Whether the statement may have run without its caller hearing how. Only an error PostgreSQL
 * reports about the statement itself ends it before its commit for sure: an SQLSTATE outside the
 * connection class 08 and the shutdown codes 57P, not FATAL. A pooler in between sends errors of
 * its own (PgBouncer's "query timeout" or "server conn crashed?", 08P01, FATAL) while the backend
 * behind it goes on and commits, so those are settled like a broken connection. An error raised
 * while the pool was still connecting (`neverSent` from @sluice/postgres) sent nothing.
 */
export function answerLost(error: unknown): boolean {
  const e = error as
    { code?: unknown; severity?: unknown; message?: unknown; neverSent?: unknown } | undefined;
  if (e?.neverSent === true) return false;
  // The severity is in the server's language; the connection (08) and shutdown (57P) classes are not.
  const code = typeof e?.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code) ? e.code : undefined;
  if (code && !/^(08|57P)/.test(code) && e?.severity !== 'FATAL' && e?.severity !== 'PANIC') return false;
  const message = typeof e?.message === 'string' ? e.message : '';
  return !neverSent.some((pattern) => pattern.test(message));
}

async function fenceAndRead(db: Database, batch: string, ids: string[]): Promise<RunRow[]> {
  await db.query('INSERT INTO admission_fences (batch) VALUES ($1::text) ON CONFLICT (batch) DO NOTHING', [
    batch,
  ]);
  return db.transaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(hashtextextended('sluice:admission:' || $1::text, 0))`, [
      batch,
    ]);
    return (await tx.query<RunRow>(`SELECT ${full} FROM agent_runs WHERE id = ANY($1::text[])`, [ids])).rows;
  });
}

/**
 * What became of a batch whose statement was sent at `sentAt` and whose answer was lost: its
 * rows when it wrote them, `lost` thrown when it did not (and never will), and
 * AdmissionOutcomeUnknown when the database could not be asked before `sentAt + lockWaitMs +
 * SETTLE_MARGIN_MS`.
 */
export async function settleLostAdmission(
  db: Database,
  ids: string[],
  lost: unknown,
  sentAt: number,
  lockWaitMs: number,
  clock: Clock = systemClock,
): Promise<RunRow[]> {
  const deadline = sentAt + lockWaitMs + SETTLE_MARGIN_MS;
  for (let attempt = 0; ; attempt++) {
    let rows: RunRow[];
    try {
      rows = await fenceAndRead(db, ids[0]!, ids);
    } catch {
      if (clock.now() >= deadline) throw new AdmissionOutcomeUnknown(lost, ids);
      await new Promise((resolve) =>
        setTimeout(resolve, Math.min(100 * 2 ** attempt, 1_000, deadline - clock.now())),
      );
      continue;
    }
    // One statement wrote the whole batch or nothing.
    if (rows.length === 0) throw lost;
    if (rows.length !== ids.length) throw new AdmissionOutcomeUnknown(lost, ids);
    return rows;
  }
}

/**
 * An admission transaction (the locked path, or a batch too large for one statement) whose
 * COMMIT's answer may be lost: `body` returns its outcome and the ids of the runs it wrote.
 * Before the COMMIT the transaction takes the batch's lock (the first id's), so a settling
 * waits for the commit to end; a lost answer to the COMMIT is settled as the one statement's
 * is. A failure before the COMMIT sent nothing that could commit.
 */
export async function settledTransaction<T>(
  db: Database,
  lockWaitMs: number,
  clock: Clock,
  body: (tx: SqlClient) => Promise<{ outcome: T; written: string[] }>,
): Promise<T> {
  let committing: { outcome: T; written: string[]; at: number } | undefined;
  try {
    return await db.transaction(async (tx) => {
      const { outcome, written } = await body(tx);
      if (written.length > 0)
        await tx.query(`SELECT pg_advisory_xact_lock(hashtextextended('sluice:admission:' || $1::text, 0))`, [
          written[0],
        ]);
      committing = { outcome, written, at: clock.now() };
      return outcome;
    });
  } catch (error) {
    if (!committing || committing.written.length === 0 || !answerLost(error)) throw error;
    await settleLostAdmission(db, committing.written, error, committing.at, lockWaitMs, clock);
    return committing.outcome;
  }
}

/**
 * The error each caller of a batch hears: the runs of its own, when the outcome is unknown (a
 * caller must not see another user's run ids, nor take another's run for its own). A caller
 * whose run was not among those written hears the lost answer itself: nothing of its was.
 */
export function errorFor(error: unknown, runId: string | undefined): unknown {
  if (!(error instanceof AdmissionOutcomeUnknown)) return error;
  return runId !== undefined && error.ids.includes(runId)
    ? new AdmissionOutcomeUnknown(error.lost, [runId])
    : error.lost;
}

/** Fences a day old: no statement sent that long ago is still waiting for its locks. */
export async function pruneAdmissionFences(db: Database): Promise<void> {
  await db.query(`DELETE FROM admission_fences WHERE fenced_at < clock_timestamp() - interval '1 day'`);
}
