import type { Database } from '@sluice/postgres/database';

/** Server processes in the shared database: heartbeats, lost runs, retention. */

/** Records that this process is alive. */
export async function heartbeat(db: Database, node: string): Promise<void> {
  await db.query(
    `INSERT INTO server_nodes (id) VALUES ($1::text)
     ON CONFLICT (id) DO UPDATE SET heartbeat_at = clock_timestamp()`,
    [node],
  );
}

/**
 * Ends runs whose process stopped heartbeating `staleMs` ago (or never registered): failed,
 * `worker_lost`. They are never run again: they may already have had side effects.
 */
export async function failLostRuns(db: Database, staleMs: number): Promise<number> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs r SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'worker_lost', 'message', 'the server running this run stopped before it finished')
     WHERE r.status = 'running' AND NOT EXISTS (
       SELECT 1 FROM server_nodes n WHERE n.id = r.worker
         AND n.heartbeat_at > clock_timestamp() - $1::float8 * interval '1 millisecond')
     RETURNING r.id`,
    [staleMs],
  );
  return result.rows.length;
}

/** Runs of this process that did not finish within the drain time: failed, `interrupted`. */
export async function interruptRuns(db: Database, node: string, ids: string[]): Promise<string[]> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'interrupted', 'message', 'the server stopped before this run finished; start it again')
     WHERE status = 'running' AND worker = $1::text AND id = ANY($2::text[]) RETURNING id`,
    [node, ids],
  );
  return result.rows.map((r) => r.id);
}

/** This process is leaving: peers need not wait for its heartbeat to go stale. */
export async function leave(db: Database, node: string): Promise<void> {
  await db.query('DELETE FROM server_nodes WHERE id = $1::text', [node]);
}

/** Rows of processes gone for a day (one per boot would otherwise pile up). */
export async function pruneNodes(db: Database): Promise<void> {
  await db.query(`DELETE FROM server_nodes WHERE heartbeat_at < clock_timestamp() - interval '1 day'`);
}

/**
 * Ends this process's own `running` rows that it no longer executes: a run it stopped while its
 * heartbeat was failing, or whose end it could not record while the database was away. Nobody
 * else would end them (this process heartbeats again), and they would hold their tenant's cap.
 * A run asked to cancel ends `canceled`, any other `failed` / `worker_lost`. Rows younger than
 * `graceMs` are left alone: an inline run is written a moment before it starts executing.
 */
export async function endOrphanedRuns(
  db: Database,
  node: string,
  executing: string[],
  graceMs: number,
): Promise<number> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs SET finished_at = clock_timestamp(),
       status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'canceled' ELSE 'failed' END,
       error = CASE WHEN cancel_requested_at IS NOT NULL THEN NULL ELSE jsonb_build_object('type', 'worker_lost',
         'message', 'the server running this run lost it (its database was away) before it finished') END
     WHERE status = 'running' AND worker = $1::text AND NOT (id = ANY($2::text[]))
       AND started_at < clock_timestamp() - $3::float8 * interval '1 millisecond'
     RETURNING id`,
    [node, executing, graceMs],
  );
  return result.rows.length;
}
