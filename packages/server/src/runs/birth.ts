import { prepared, type Database, type SqlClient } from '@sluice/postgres/database';
import { systemClock, type Clock } from 'sluice/concurrency';
import type { Principal } from '../store/tokens.js';
import { answerLost, settledTransaction, settleLostAdmission } from './admission-settle.js';
import type { HighestCounts } from './caps.js';
import { inOrder, runDocuments } from './run-documents.js';
import type { RunStatus } from './states.js';
import { full, type NewRun, type RunRow } from './store.js';

/**
 * A run's birth: the statements admission writes runs with, through the SQL functions of sql/016
 * and sql/034 (which write the status bornStatus gives). Part of the lifecycle drawn in
 * runs/lifecycle.ts, which exports these too.
 */

/** The state an admitted run is written in. */
export function bornStatus(run: Pick<NewRun, 'schedule' | 'mode'>): RunStatus {
  if (run.schedule !== undefined) return 'scheduled';
  return run.mode === 'inline' ? 'running' : 'queued';
}

async function insertChunks(tx: SqlClient, chunks: string[]): Promise<RunRow[]> {
  const rows: RunRow[] = [];
  for (const chunk of chunks) {
    const inserted = await tx.query<RunRow>(
      `SELECT ${full} FROM sluice_insert_runs($1::jsonb) AS agent_runs`,
      [chunk],
    );
    rows.push(...inserted.rows);
  }
  return rows;
}

/**
 * Inserts admitted runs (one admission batch: one round trip for all of them, unless they are
 * large), inside the admission transaction. Rows come back in the order given.
 */
export async function insertRuns(tx: SqlClient, runs: { who: Principal; run: NewRun }[]): Promise<RunRow[]> {
  const { ids, chunks } = runDocuments(runs, bornStatus);
  return inOrder(ids, await insertChunks(tx, chunks));
}

/** Inserts one admitted run (inside the admission transaction). */
export async function insertRun(tx: SqlClient, who: Principal, run: NewRun): Promise<RunRow> {
  return (await insertRuns(tx, [{ who, run }]))[0]!;
}

/** The statement that writes a batch alone (sql/034_admission_alone.sql). */
const admitAlone = prepared(
  `SELECT ${full} FROM sluice_admit($1::text, $2::jsonb, $3::jsonb, $4::int) AS agent_runs`,
);

/**
 * Writes a batch decided without the lock (from a plain read, or from the counts this process
 * expects), unless a count has risen past what the batch allows: then nothing is written and the
 * result is undefined (the caller decides again under the lock). One statement sent on its own
 * waits for the tenant's lock at most `lockWaitMs`, checks, inserts and commits: one round trip,
 * the lock held for no round trip at all. When its answer is lost, what it did is read before
 * anything is answered (runs/admission-settle.ts), so a caller told "failed" never has a run
 * written. A batch too large for one statement is written in a transaction, its first part by
 * the same statement.
 */
export async function admitDecided(
  db: Database,
  tenant: string,
  highest: HighestCounts[],
  runs: { who: Principal; run: NewRun }[],
  lockWaitMs = 15_000,
  clock: Clock = systemClock,
): Promise<RunRow[] | undefined> {
  const { ids, chunks } = runDocuments(runs, bornStatus);
  const params = [
    tenant,
    JSON.stringify(highest),
    chunks[0],
    Math.max(1, Math.min(Math.round(lockWaitMs), 2 ** 31 - 1)),
  ];
  if (chunks.length > 1)
    return settledTransaction(db, lockWaitMs, clock, async (tx) => {
      const first = await tx.query<RunRow>(admitAlone, params);
      if (first.rows.length === 0) return { outcome: undefined, written: [] };
      return {
        outcome: inOrder(ids, [...first.rows, ...(await insertChunks(tx, chunks.slice(1)))]),
        written: ids,
      };
    });
  const sentAt = clock.now();
  let rows: RunRow[];
  try {
    rows = (await db.query<RunRow>(admitAlone, params)).rows;
  } catch (error) {
    if (!answerLost(error)) throw error;
    rows = await settleLostAdmission(db, ids, error, sentAt, lockWaitMs, clock);
  }
  return rows.length === 0 ? undefined : inOrder(ids, rows);
}
