import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { admitRun } from '../../src/runs/admission.js';
import type { TenantLimits } from '../../src/runs/policy.js';
import { newRunId } from '../../src/runs/store.js';
import type { Principal } from '../../src/store/tokens.js';
import {
  afterThisTest,
  freshDatabase,
  postgres,
  startDatabaseProxy,
  throughProxy,
  until,
} from '../helpers.js';
import { run } from './admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/*
 * The fast path: sluice_admit_runs is one autocommit statement, and the Sync
 * that commits it reaches the backend with it. When the connection to the database breaks while
 * the statement waits for the tenant's lock, the caller is told the admission failed (503, try
 * again), but the backend goes on once the lock is free: it inserts and commits the run. Before,
 * the lock was its own statement inside BEGIN ... COMMIT: a connection lost while waiting meant
 * the INSERT and COMMIT never arrived, and the transaction rolled back. Now a retried request
 * is a second run (the first one executes for nobody), and a held run is a `running` row no
 * process executes until the orphan sweep fails it.
 */
const limits: TenantLimits = { activePerTenant: 0, activePerProject: 0, deferredQueued: 0, scheduled: 0 };
const who: Principal = { tokenId: 'tok', tenant: 'cut', project: 'p', user: 'u', role: 'member' };

describeWith({ PostgreSQL: postgres })('a connection lost while the fast path waits for the lock', () => {
  it('an admission whose caller was told it failed is not written', async () => {
    const url = await freshDatabase();
    const proxy = await startDatabaseProxy();
    const dir = mkdtempSync(join(tmpdir(), 'sluice-r15-'));
    const store = await openStore({ databaseUrl: throughProxy(url, proxy.port), dataDir: dir });
    afterThisTest(async () => {
      await store.close().catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    });
    // The line's first batch reconciles under the lock; the next one takes the fast path.
    expect((await admitRun(store.db, who, run(), limits)).ok).toBe(true);

    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    afterThisTest(() => holder.end());
    await holder.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:cut'))`);
    const id = newRunId();
    const outcome = admitRun(store.db, who, run({ id }), limits).then(
      () => 'admitted',
      (error: unknown) => `failed: ${String(error)}`,
    );
    await until(
      async () =>
        (
          await holder.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          )
        ).rows[0]!.n === 1,
      'the admission waiting for the tenant lock',
    );
    proxy.cut();
    expect(await outcome).toMatch(/^failed/);

    await holder.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:cut'))`);
    // Every backend of the cut connections has ended (it noticed, one way or another).
    await until(
      async () =>
        (
          await holder.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`,
          )
        ).rows[0]!.n === 0,
      'the cut backends ending',
    );
    const written = await holder.query(`SELECT id, status FROM agent_runs WHERE id = $1::text`, [id]);
    expect(written.rows).toEqual([]);
  }, 30_000);
});
