import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { splitSqlStatements, toDatabase, type Database } from '@sluice/postgres/database';

// Beside src/ and dist/ alike, so the source and the built package read the same files.
const migrationsDir = new URL('../../sql/', import.meta.url);

export interface Store {
  readonly db: Database;
  /** The pool or PGlite instance behind `db` (for limiters that share it). */
  readonly handle: pg.Pool | PGlite;
  close(): Promise<void>;
}

/**
 * Opens the server's database: PostgreSQL when `databaseUrl` is set, else embedded PGlite in
 * `dataDir`. Applies the numbered migrations that are missing, one transaction each, under an
 * advisory lock, so several servers booting at once apply each exactly once.
 */
export async function openStore(options: { databaseUrl?: string; dataDir: string }): Promise<Store> {
  let handle: pg.Pool | PGlite;
  let lock: string | undefined;
  if (options.databaseUrl) {
    handle = new pg.Pool({ connectionString: options.databaseUrl, max: 20 });
  } else {
    // Embedded PGlite is one process's database: a second process must not open it.
    lock = `${options.dataDir}.lock`;
    if (existsSync(lock)) {
      const pid = Number(readFileSync(lock, 'utf8'));
      if (pid !== process.pid && isAlive(pid)) {
        throw new Error(
          `The embedded database ${options.dataDir} is in use by process ${pid} (a running server?). ` +
            'Stop it first, or set DATABASE_URL to share a PostgreSQL server.',
        );
      }
    }
    writeFileSync(lock, String(process.pid));
    handle = new PGlite(options.dataDir);
    await handle.waitReady;
  }
  const db = toDatabase(handle);
  await migrate(db);
  return {
    db,
    handle,
    close: async () => {
      await (handle instanceof PGlite ? handle.close() : handle.end());
      if (lock) rmSync(lock, { force: true });
    },
  };
}

function isAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export async function migrate(db: Database): Promise<void> {
  const files = readdirSync(migrationsDir)
    .filter((f) => /^\d+_.*\.sql$/.test(f))
    .sort();
  for (const file of files) {
    const version = Number(file.split('_')[0]);
    await db.transaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', ['sluice:server:migrations']);
      await tx.query(
        'CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())',
      );
      const done = await tx.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM schema_migrations WHERE version = $1::int',
        [version],
      );
      if (done.rows[0]!.n > 0) return;
      for (const statement of splitSqlStatements(readFileSync(new URL(file, migrationsDir), 'utf8'))) {
        await tx.query(statement);
      }
      await tx.query('INSERT INTO schema_migrations (version) VALUES ($1::int)', [version]);
    });
  }
}
