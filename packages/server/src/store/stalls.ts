import type pg from 'pg';

/** node-postgres's error for a statement whose answer did not come within `query_timeout`. */
const isReadTimeout = (error: unknown): boolean =>
  (error as Error | undefined)?.message === 'Query read timeout';

/**
 * A statement left unanswered past its bound means the way to the database went silent with
 * no reset (a partition, a proxy or NAT that forgot the connections). The idle connections
 * opened over that way are almost surely silent too, and each would hold the next statement
 * sent on it for the whole bound: one after another, minutes of hangs, the heartbeat's among
 * them (then peers declare the process gone and fail its runs while it is answering ready).
 * So when one statement meets that, every idle connection is dropped at once; the next
 * statements open new ones. Connections in use are left to their own bound.
 *
 * Behind a pooler in transaction mode a single statement has only the role's statement timeout
 * (docs/deploy.md): without one, a statement merely slow past the bound (or queued that long in
 * the pooler) drops the idle connections too. Those are connections to the pooler, which are
 * cheap to open again.
 */
export function dropIdleOnStall(pool: pg.Pool): void {
  const open = new Set<pg.PoolClient>();
  const inUse = new Set<pg.PoolClient>();
  pool.on('connect', (client) => open.add(client));
  pool.on('acquire', (client) => inUse.add(client));
  pool.on('remove', (client) => {
    open.delete(client);
    inUse.delete(client);
  });
  // The pool's own removal, which takes a client out of its idle list at once: a socket closed
  // under an idle client leaves it there until the close is heard, long enough to be handed to
  // the next statement, which then fails. (pg-pool 3's `_remove`, pinned by the lock file and
  // held by test/store/stalled-connection.test.ts.)
  const remove = (pool as unknown as { _remove?: (client: pg.PoolClient) => void })._remove?.bind(pool);
  pool.on('release', (error: Error | undefined, client: pg.PoolClient) => {
    inUse.delete(client);
    if (!isReadTimeout(error) || !remove) return;
    for (const idle of open) {
      if (idle === client || inUse.has(idle)) continue;
      open.delete(idle);
      remove(idle);
      // Its goodbye cannot get through the silent connection: the socket is closed now.
      (idle as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
    }
  });
}
