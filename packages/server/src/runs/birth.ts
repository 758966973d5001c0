import { prepared, type Database, type SqlClient } from '@sluice/postgres/database';
import type { Principal } from '../store/tokens.js';
import type { HighestCounts } from './caps.js';
import { inOrder, runDocuments } from './run-documents.js';
import type { RunStatus } from './states.js';
import { full, type NewRun, type RunRow } from './store.js';

/**
 * A run's birth: the statements admission writes runs with, each through the SQL functions of
 * sql/016 and sql/019 (which write the status bornStatus gives). Part of the lifecycle drawn in
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

/**
 * Inserts a batch decided from a plain read, unless a count has risen past what the batch
 * allows: then nothing is written and the result is undefined (the caller decides again under
 * the lock). One statement takes the tenant's lock, checks and inserts; it runs inside a
 * transaction (BEGIN, it, COMMIT) and not on its own: a statement sent alone commits on the
 * server even when the connection drops while it waits for the lock, and its caller, told it
 * failed, would try again and make the run twice. READ COMMITTED is stated by the transaction
 * too: the check must read what committed while the statement waited for the lock.
 */
export async function admitDecided(
  db: Database,
  tenant: string,
  highest: HighestCounts[],
  runs: { who: Principal; run: NewRun }[],
): Promise<RunRow[] | undefined> {
  const { ids, chunks } = runDocuments(runs, bornStatus);
  return db.transaction(async (tx) => {
    const first = await tx.query<RunRow>(
      prepared(`SELECT ${full} FROM sluice_admit_runs($1::text, $2::jsonb, $3::jsonb) AS agent_runs`),
      [tenant, JSON.stringify(highest), chunks[0]],
    );
    if (first.rows.length === 0) return undefined;
    return inOrder(ids, [...first.rows, ...(await insertChunks(tx, chunks.slice(1)))]);
  });
}

/**
 * Held runs (executed on this process) decided from the counts this process expects, written by
 * one statement sent on its own (sql/019_admission_one_statement.sql): it waits for the tenant's
 * lock at most `lockWaitMs`, checks as admitDecided's statement does, inserts and commits, in one
 * round trip. Undefined, with nothing written, when a count rose past what the batch allows, the
 * session is not READ COMMITTED, or the batch is too large for one statement: the caller then
 * decides as before. Only held runs: a run committed by a statement whose answer was lost is
 * never executed (no queue worker claims a held run) and upkeep ends it (endOrphanedRuns).
 */
export async function admitHeldNow(
  db: SqlClient,
  tenant: string,
  highest: HighestCounts[],
  runs: { who: Principal; run: NewRun }[],
  lockWaitMs: number,
): Promise<RunRow[] | undefined> {
  const { ids, chunks } = runDocuments(runs, bornStatus);
  if (chunks.length !== 1) return undefined;
  const inserted = await db.query<RunRow>(
    prepared(`SELECT ${full} FROM sluice_admit_held($1::text, $2::jsonb, $3::jsonb, $4::int) AS agent_runs`),
    [tenant, JSON.stringify(highest), chunks[0], Math.max(1, Math.min(Math.round(lockWaitMs), 2 ** 31 - 1))],
  );
  if (inserted.rows.length === 0) return undefined;
  return inOrder(ids, inserted.rows);
}
