import type { Database } from '@sluice/postgres/database';
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

/** The admission's answer was lost and the database could not be asked in time. */
export class AdmissionOutcomeUnknown extends Error {
  constructor(readonly lost: unknown) {
    super(`an admission's answer was lost and its outcome could not be read: ${String(lost)}`, { cause: lost });
    this.name = 'AdmissionOutcomeUnknown';
  }
}

// Errors raised before a statement leaves the process: nothing to settle.
const neverSent = [/^timeout exceeded when trying to connect$/, /pool after calling end/, /Client was closed/];

/**
 * Whether the statement may have run without its caller hearing how: any failure PostgreSQL
 * did not report itself. A reported error (an SQLSTATE and a severity) ends the statement before
 * its commit, so nothing of it stays.
 */
export function answerLost(error: unknown): boolean {
  const e = error as { code?: unknown; severity?: unknown; message?: unknown } | undefined;
  if (typeof e?.severity === 'string' && typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) return false;
  const message = typeof e?.message === 'string' ? e.message : '';
  return !neverSent.some((pattern) => pattern.test(message));
}

async function fenceAndRead(db: Database, batch: string, ids: string[]): Promise<RunRow[]> {
  await db.query('INSERT INTO admission_fences (batch) VALUES ($1::text) ON CONFLICT (batch) DO NOTHING', [batch]);
  return db.transaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(hashtextextended('sluice:admission:' || $1::text, 0))`, [batch]);
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
      if (clock.now() >= deadline) throw new AdmissionOutcomeUnknown(lost);
      await new Promise((resolve) => setTimeout(resolve, Math.min(100 * 2 ** attempt, 1_000, deadline - clock.now())));
      continue;
    }
    // One statement wrote the whole batch or nothing.
    if (rows.length === 0) throw lost;
    if (rows.length !== ids.length) throw new AdmissionOutcomeUnknown(lost);
    return rows;
  }
}

/** Fences a day old: no statement sent that long ago is still waiting for its locks. */
export async function pruneAdmissionFences(db: Database): Promise<void> {
  await db.query(`DELETE FROM admission_fences WHERE fenced_at < clock_timestamp() - interval '1 day'`);
}
