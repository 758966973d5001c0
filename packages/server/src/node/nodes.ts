import type { Database } from '@sluice/postgres/database';

/**
 * Server processes in the shared database: heartbeats and their rows. The runs a process lost
 * are ended by runs/lifecycle.ts (failLostRuns, interruptRuns, endOrphanedRuns).
 */

/** Records that this process is alive. */
export async function heartbeat(db: Database, node: string): Promise<void> {
  await db.query(
    `INSERT INTO server_nodes (id) VALUES ($1::text)
     ON CONFLICT (id) DO UPDATE SET heartbeat_at = clock_timestamp()`,
    [node],
  );
}

/** This process is leaving: peers need not wait for its heartbeat to go stale. */
export async function leave(db: Database, node: string): Promise<void> {
  await db.query('DELETE FROM server_nodes WHERE id = $1::text', [node]);
}

/** Rows of processes gone for a day (one per boot would otherwise pile up). */
export async function pruneNodes(db: Database): Promise<void> {
  await db.query(`DELETE FROM server_nodes WHERE heartbeat_at < clock_timestamp() - interval '1 day'`);
}
