import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { expect, it } from 'vitest';
import { fromPgPool } from '@sluice/postgres/database';
import { describeWith } from '../../../../scripts/service-suites.js';
import { migrate, openStore } from '../../src/store/store.js';
import { afterThisTest, freshDatabase, postgres } from '../helpers.js';

/**
 * A server of a new version migrates while an older one keeps admitting runs on the same
 * database (a rolling upgrade). Migration 032 locks agent_runs and alters admission_counters;
 * an admission of the old version reads admission_counters, then inserts into agent_runs: the
 * two waited on each other until PostgreSQL ended one of them as a deadlock (the migrating
 * process failed to start). The migration now waits for a lock briefly, steps back and tries
 * again: both go through.
 */

const sqlDir = fileURLToPath(new URL('../../sql/', import.meta.url));

describeWith({ PostgreSQL: postgres })('migrating beside a live older server', () => {
  it('an admission that read the counters and then inserts, meeting migration 032: both go through', async () => {
    const url = await freshDatabase();
    const dataDir = mkdtempSync(join(tmpdir(), 'sluice-migrate-live-'));
    afterThisTest(async () => rmSync(dataDir, { recursive: true, force: true }));
    const store = await openStore({ databaseUrl: url, dataDir });
    await store.close();
    // The database as the version before 032 left it.
    const old = new pg.Client({ connectionString: url });
    await old.connect();
    afterThisTest(() => old.end());
    const f015 = readFileSync(join(sqlDir, '015_admission_counters.sql'), 'utf8');
    await old.query('ALTER TABLE admission_counters DROP COLUMN deferred_running');
    await old.query(
      f015.slice(
        f015.indexOf('CREATE OR REPLACE FUNCTION sluice_admission_count'),
        f015.indexOf('DROP TRIGGER IF EXISTS agent_runs_admission_insert'),
      ),
    );
    await old.query('DELETE FROM schema_migrations WHERE version = 32');
    const runDoc = (id: string) =>
      JSON.stringify([
        {
          id,
          tenant: 't1',
          project: 'p',
          user_id: 'u',
          agent: 'echo',
          class: 'deferred',
          mode: 'queued',
          status: 'queued',
          input: 'x',
          metadata: {},
        },
      ]);
    await old.query('SELECT id FROM sluice_insert_runs($1::jsonb)', [runDoc('run_000000000000000000000001')]);

    // The old server's admission: it has read the tenant's counters...
    await old.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    await old.query(`SELECT project, default_active FROM admission_counters WHERE tenant = 't1'`);
    // ...the new server starts and migrates...
    const pool = new pg.Pool({ connectionString: url, max: 2 });
    afterThisTest(() => pool.end());
    const migrating = migrate(fromPgPool(pool));
    const waiting = async () =>
      (
        await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE NOT l.granted AND a.datname = current_database()`,
        )
      ).rows[0]!.n > 0;
    while (!(await waiting())) await new Promise((resolve) => setTimeout(resolve, 10));
    // ...and the admission inserts its run.
    await old.query('SELECT id FROM sluice_insert_runs($1::jsonb)', [runDoc('run_000000000000000000000002')]);
    await old.query('COMMIT');
    await migrating;
    const counters = await pool.query<{ deferred_waiting: number; deferred_running: number }>(
      `SELECT deferred_waiting, deferred_running FROM admission_counters WHERE tenant = 't1' AND project = ''`,
    );
    expect(counters.rows).toEqual([{ deferred_waiting: 2, deferred_running: 0 }]);
  });
});
