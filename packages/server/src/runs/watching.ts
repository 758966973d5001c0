import type { SqlClient } from '@sluice/postgres/database';
import type { RunStatus } from './states.js';

/**
 * Marks a run watched (sql/035_watched_runs.sql): from now on its end and its stored events
 * are announced by NOTIFY to every process. A process calls it when it begins to wait for a
 * run or to read its stream, after its own waiter is in place and before it reads the row.
 *
 * The run's status as the mark left it, or undefined when there is no such run. The mark is an
 * UPDATE, so it reads the newest version of the row whatever its snapshot: an end committed
 * before it is in the status returned, and one committed after it finds the row marked and
 * notifies. (With `NOT watched` in the WHERE, a run marked by another process would be
 * answered from the statement's snapshot, which can predate an end that was not announced.)
 */
export async function watchRun(db: SqlClient, id: string): Promise<RunStatus | undefined> {
  const { rows } = await db.query<{ status: RunStatus }>(
    'UPDATE agent_runs SET watched = true WHERE id = $1::text RETURNING status',
    [id],
  );
  return rows[0]?.status;
}
