import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { admitRun } from '../../src/runs/admission.js';
import { openStore } from '../../src/store/store.js';
import { limits, run, who } from '../limits/admission-fixtures.js';
import {
  afterThisTest,
  deferred,
  freshDatabase,
  postgres,
  startDatabaseProxy,
  throughProxy,
} from '../helpers.js';

// Found by the soak (db_stall): one server's connection went silent inside a transaction that
// held a tenant's admission lock. PostgreSQL kept the session, and its locks, until
// idle_in_transaction_session_timeout (then one minute); a second server's admissions for that
// tenant waited out their lock timeout (the statement timeout) and were answered 503, for up
// to a minute after the stall. The idle bound is now below the lock timeout.

const STATEMENT_TIMEOUT_MS = 9000;

describeWith({ PostgreSQL: postgres })('a transaction whose connection went silent', () => {
  it("frees its locks before a peer's lock wait on them runs out", async () => {
    const url = await freshDatabase();
    const proxy = await startDatabaseProxy();
    const open = async (databaseUrl: string) => {
      const store = await openStore({
        databaseUrl,
        dataDir: '/nonexistent',
        statementTimeoutMs: STATEMENT_TIMEOUT_MS,
      });
      afterThisTest(() => store.close());
      return store.db;
    };
    const stalled = await open(throughProxy(url, proxy.port));
    const peer = await open(url);
    const tenant = 'stalled';
    const locked = deferred<void>();
    const stuck = stalled.transaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:tenant:${tenant}`]);
      proxy.stall();
      locked.resolve();
      await tx.query('SELECT 1');
    });
    const stuckOutcome = stuck.then(
      () => 'committed',
      (error: unknown) => (error as Error).message,
    );
    await locked.promise;

    // The peer's admission waits on the lock the silent session holds; PostgreSQL ends that
    // session while the wait is still within its lock timeout, and the run is admitted.
    const startedAt = Date.now();
    const admission = await admitRun(peer, who(tenant), run(), limits(), STATEMENT_TIMEOUT_MS);
    expect(admission.ok).toBe(true);
    expect(Date.now() - startedAt).toBeLessThan(STATEMENT_TIMEOUT_MS);
    // The silent one learns nothing of it until its own statement times out: it did not commit.
    expect(await stuckOutcome).toMatch(/timeout/i);
  }, 60_000);
});
