import { cpSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { inject } from 'vitest';
import { urlOf } from '../../../../scripts/postgres-config.js';
import { afterThisTest } from './registry.js';

// The databases of the server tests: a copy of the migrated PGlite template the global setup
// made (scripts/vitest-global-setup.ts), or a PostgreSQL database of this run's server.

/** Connection settings of this run's PostgreSQL (see scripts/vitest-global-setup.ts); undefined without one. */
export const postgres = inject('postgres');

/**
 * A temp folder holding an embedded database that is already created and migrated: a copy of
 * the one the test run's global setup made, which opens in a fraction of the seconds PGlite's
 * initdb takes. Not removed here: the server that opens it removes it after closing.
 */
export async function preparedDataDir(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-server-test-'));
  cpSync(inject('pgliteTemplate'), join(dir, 'db'), { recursive: true });
  return dir;
}

/** Runs one statement on the run's PostgreSQL server, on a connection closed after it. */
async function onAdminConnection(sql: string): Promise<void> {
  const client = new pg.Client({ ...postgres });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/** A new empty PostgreSQL database for this test (dropped after it); its connection string. */
export async function freshDatabase(): Promise<string> {
  if (!postgres) throw new Error('PostgreSQL is not available');
  const name = `sluice_t_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e9).toString(36)}`;
  await onAdminConnection(`CREATE DATABASE ${name}`);
  afterThisTest(async () => {
    const client = new pg.Client({ ...postgres });
    await client.connect();
    try {
      // The test's pools have ended, but pg's end() resolves before their sockets close: FORCE
      // would terminate those still closing, and each would report it as a pool 'error'. Give
      // them a moment to go first (a session still there after it is terminated).
      for (let i = 0; i < 80; i++) {
        const { rows } = await client.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1',
          [name],
        );
        if (rows[0]!.n === 0) break;
        await new Promise((r) => setTimeout(r, 25));
      }
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    } finally {
      await client.end();
    }
  }, `database ${name}`);
  return urlOf(postgres, name);
}

/** A pool on `url`, ended after the test; the guard checks that it holds no connection then. */
export function testPool(url: string, max = 2): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max });
  pool.on('error', () => undefined); // its database may be dropped after the test
  afterThisTest(
    () => pool.end(),
    'a test pool',
    () => poolLeftovers(pool),
  );
  return pool;
}

/** What of a pool is still open: its connections. */
export function poolLeftovers(pool: pg.Pool): string[] {
  return pool.totalCount > 0 ? [`${pool.totalCount} connection(s) still open`] : [];
}

/** The ids of the runs `worker` (a server's executor node) left `running` in the database at `url`. */
export async function runsLeftRunning(url: string, worker: string): Promise<string[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ id: string }>(
      "SELECT id FROM agent_runs WHERE status = 'running' AND worker = $1 ORDER BY id",
      [worker],
    );
    return rows.map((r) => r.id);
  } finally {
    await client.end();
  }
}
