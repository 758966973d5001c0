import type { SqlClient } from '@sluice/postgres/database';
import { finalStatuses, sqlList, type RunStatus } from './states.js';

/**
 * Marks a run watched (sql/035_watched_runs.sql): from now on its end and its stored events
 * are announced by NOTIFY to every process. A process calls it when it begins to wait for a
 * run or to read its stream, after its own waiter is in place.
 *
 * Returns the run's status read after the mark committed, or undefined when there is no such
 * run: an end that came before the mark is in it, and one after it is announced. The mark
 * takes the run's watch lock, not its row: a claim passing over locked rows does not pass over
 * a queued run being marked. A run found ended, or not found, gets no row; one that ended while
 * the mark waited for the lock may keep one, which `pruneWatches` removes (node upkeep).
 */
export async function watchRun(db: SqlClient, id: string): Promise<RunStatus | undefined> {
  await markWatched(db, id);
  const { rows } = await db.query<{ status: RunStatus }>(
    'SELECT status FROM agent_runs WHERE id = $1::text',
    [id],
  );
  return rows[0]?.status;
}

/** The mark alone, for a caller that reads the run itself once it is done. */
export async function markWatched(db: SqlClient, id: string): Promise<void> {
  await db.query(
    `WITH locked AS (SELECT pg_advisory_xact_lock(hashtext('sluice:watch'), hashtext($1::text) & 255))
     INSERT INTO run_watches (run_id)
     SELECT $1::text FROM locked
     WHERE EXISTS (SELECT 1 FROM agent_runs WHERE id = $1::text AND status NOT IN (${sqlList(finalStatuses)}))
     ON CONFLICT DO NOTHING`,
    [id],
  );
}

/**
 * Takes out the marks of runs that ended or are gone (a mark that waited for the lock while its
 * run ended), and of runs waited on for more than a day (a paused run's waiters go, and its end
 * is announced by then to nobody who still waits). At most 10,000 a pass.
 */
export async function pruneWatches(db: SqlClient): Promise<void> {
  await db.query(
    `DELETE FROM run_watches WHERE run_id IN (
       SELECT w.run_id FROM run_watches w LEFT JOIN agent_runs r ON r.id = w.run_id
       WHERE r.id IS NULL OR r.status IN (${sqlList(finalStatuses)}) OR w.watched_at < clock_timestamp() - interval '1 day'
       LIMIT 10000)`,
  );
}
