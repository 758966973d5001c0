import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { isStoreUnavailable, refusalOf } from '../../src/http/errors.js';
import { admitRun, type Admission } from '../../src/runs/admission.js';
import { answerLost } from '../../src/runs/admission-settle.js';
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
 * Admission writes a batch with one statement sent on its own (sql/034_admission_alone.sql),
 * which commits on the server whether or not its answer comes back. A caller told "failed"
 * tries again; a caller told "admitted" has a run. So when the connection breaks while the
 * statement is out, what the caller hears must be what the database keeps, in every order of
 * events: the statement still waiting for the tenant's lock, already committed, or between its
 * fence check and its commit; and the database reachable again at once, or not before the
 * statement's bounds are out.
 */
const limits: TenantLimits = { activePerTenant: 0, activePerProject: 0, deferredQueued: 0, scheduled: 0 };
const tenant = 'cut';
const who: Principal = { tokenId: 'tok', tenant, project: 'p', user: 'u', role: 'member' };
const LOCK_WAIT_MS = 5_000;

type Heard = { admitted: string } | { failed: unknown };

async function setUp() {
  const url = await freshDatabase();
  const proxy = await startDatabaseProxy();
  const dir = mkdtempSync(join(tmpdir(), 'sluice-cut-'));
  const store = await openStore({ databaseUrl: throughProxy(url, proxy.port), dataDir: dir });
  afterThisTest(async () => {
    await store.close().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  });
  const holder = new pg.Client({ connectionString: url });
  await holder.connect();
  afterThisTest(() => holder.end());
  const count = async (sql: string, params: unknown[] = []) =>
    (await holder.query<{ n: number }>(sql, params)).rows[0]!.n;
  // The line's first batch reconciles under the lock; the next ones go alone.
  expect((await admitRun(store.db, who, run(), limits, LOCK_WAIT_MS)).ok).toBe(true);

  const admit = (id: string, lockWaitMs = LOCK_WAIT_MS, caps: TenantLimits = limits): Promise<Heard> =>
    admitRun(store.db, who, run({ id }), caps, lockWaitMs).then(
      (a: Admission) => (a.ok ? { admitted: a.run.id } : { failed: a.refusal }),
      (error: unknown) => ({ failed: error }),
    );
  const advisoryWaits = () =>
    count(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
    );
  const rowsOf = (id: string) => count('SELECT count(*)::int AS n FROM agent_runs WHERE id = $1::text', [id]);
  /** Until no session of this database runs an admission statement (the lost one has ended). */
  const statementEnded = () =>
    until(
      async () =>
        (await count(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE datname = current_database() AND state = 'active' AND query LIKE '%sluice_admit(%'
             AND pid <> pg_backend_pid()`,
        )) === 0,
      'the lost statement ending',
    );
  const lockTenant = () => holder.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:${tenant}'))`);
  const unlockTenant = () => holder.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:${tenant}'))`);
  return {
    proxy,
    holder,
    admit,
    advisoryWaits,
    rowsOf,
    statementEnded,
    lockTenant,
    unlockTenant,
    count,
    db: store.db,
  };
}

describeWith({ PostgreSQL: postgres })('a connection lost while an admission statement is out', () => {
  it('cut while it waits for the lock: the caller hears "failed" and the statement, let in later, writes nothing', async () => {
    const { proxy, admit, advisoryWaits, rowsOf, statementEnded, lockTenant, unlockTenant, count } =
      await setUp();
    await lockTenant();
    const id = newRunId();
    const heard = admit(id);
    await until(async () => (await advisoryWaits()) === 1, 'the admission waiting for the tenant lock');
    proxy.cut();
    proxy.restore();
    const outcome = await heard;
    expect(outcome).toHaveProperty('failed');
    expect(String((outcome as { failed: unknown }).failed)).toMatch(/Connection terminated/);
    // The batch is fenced, and the statement that was waiting goes on once the lock is free.
    expect(await count('SELECT count(*)::int AS n FROM admission_fences WHERE batch = $1::text', [id])).toBe(
      1,
    );
    await unlockTenant();
    await statementEnded();
    expect(await rowsOf(id)).toBe(0);
  }, 30_000);

  it('cut after it committed: the caller hears "admitted", with the run the database has', async () => {
    const { proxy, admit, advisoryWaits, rowsOf, lockTenant, unlockTenant } = await setUp();
    await lockTenant();
    const id = newRunId();
    const heard = admit(id);
    await until(async () => (await advisoryWaits()) === 1, 'the admission waiting for the tenant lock');
    // Its answer will go nowhere: the way back is silent, and nothing is closed yet.
    proxy.stall();
    await unlockTenant();
    await until(async () => (await rowsOf(id)) === 1, 'the statement committing');
    proxy.cut();
    proxy.restore();
    expect(await heard).toEqual({ admitted: id });
  }, 30_000);

  it('cut between its fence check and its commit: the settling waits for it, and hears "admitted"', async () => {
    const { proxy, holder, admit, advisoryWaits, rowsOf, count } = await setUp();
    // The statement passes both locks and its checks, then its insert waits for the tenant's
    // counters row (the counters' trigger locks it), held here.
    await holder.query('BEGIN');
    await holder.query(
      `SELECT 1 FROM admission_counters WHERE tenant = $1::text AND project = '' FOR UPDATE`,
      [tenant],
    );
    const id = newRunId();
    const heard = admit(id);
    const rowLockWaits = () =>
      count(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype IN ('transactionid', 'tuple') AND NOT granted
         AND pid <> pg_backend_pid()`,
      );
    await until(async () => (await rowLockWaits()) >= 1, 'the insert waiting for the counters row');
    proxy.cut();
    proxy.restore();
    // The caller fences the batch and then waits for the batch's lock, which the statement holds.
    await until(async () => (await advisoryWaits()) === 1, "the settling waiting for the batch's lock");
    await holder.query('COMMIT');
    expect(await heard).toEqual({ admitted: id });
    expect(await rowsOf(id)).toBe(1);
  }, 30_000);

  it('the database out of reach past the bounds: 503, outcome unknown, and the statement ended by its lock wait', async () => {
    const lockWaitMs = 1_000;
    const { proxy, admit, advisoryWaits, rowsOf, statementEnded, lockTenant, unlockTenant } = await setUp();
    await lockTenant();
    // Three callers in one batch (one statement).
    const ids = [newRunId(), newRunId(), newRunId()];
    const heard = ids.map((id) => admit(id, lockWaitMs));
    await until(async () => (await advisoryWaits()) === 1, 'the admission waiting for the tenant lock');
    proxy.cut();
    for (const [i, id] of ids.entries()) {
      const outcome = (await heard[i]!) as { failed: Error };
      expect(outcome.failed.name).toBe('AdmissionOutcomeUnknown');
      expect(isStoreUnavailable(outcome.failed)).toBe(true);
      // Not a plain "try again": the answer names the caller's own run (and no one else's), which
      // may exist.
      const answer = refusalOf(outcome.failed)!;
      expect(answer.status).toBe(503);
      expect(answer.body()).toMatchObject({ error: { type: 'admission_outcome_unknown', run_ids: [id] } });
    }
    const id = ids[0]!;
    // Its bound passed while it waited: the statement gave up on the lock, so nothing was written.
    await statementEnded();
    await unlockTenant();
    for (const each of [id, ...ids.slice(1)]) expect(await rowsOf(each)).toBe(0);
    proxy.restore();
  }, 30_000);

  it('the locked path (a run quota): a COMMIT whose answer is lost is waited for, and the caller hears "admitted"', async () => {
    const { proxy, holder, admit, advisoryWaits, rowsOf } = await setUp();
    // Each new run's COMMIT waits for advisory lock 4242, held here (a deferred trigger).
    await holder.query(`CREATE FUNCTION wait_4242() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$`);
    await holder.query(`CREATE CONSTRAINT TRIGGER wait_4242 AFTER INSERT ON agent_runs
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION wait_4242()`);
    await holder.query('SELECT pg_advisory_lock(4242)');
    const quota = { ...limits, runQuota: { limit: 100, windowMs: 60_000 } };
    const id = newRunId();
    const heard = admit(id, LOCK_WAIT_MS, quota);
    await until(async () => (await advisoryWaits()) === 1, 'the COMMIT waiting');
    proxy.cut();
    proxy.restore();
    // The caller asks what became of the batch; the transaction holds its lock until it ends.
    await until(async () => (await advisoryWaits()) === 2, "the settling waiting for the batch's lock");
    await holder.query('SELECT pg_advisory_unlock(4242)');
    expect(await heard).toEqual({ admitted: id });
    expect(await rowsOf(id)).toBe(1);
  }, 30_000);

  it('no connection to be had: the statement was never sent, and the caller hears so at once', async () => {
    const { proxy, admit, rowsOf, db } = await setUp();
    proxy.cut();
    // The pool's idle connections were cut too: a statement handed one may have left before the
    // close was heard (that one is settled). Until they are all dropped:
    await until(
      async () =>
        ((await db.query('SELECT 1').catch((error: unknown) => error)) as { neverSent?: boolean })
          .neverSent === true,
      'no connection left to hand out',
    );
    // Settling would go on until the lock wait (a minute here) had passed, past this test's bound.
    const id = newRunId();
    const outcome = (await admit(id, 60_000)) as { failed: Error & { neverSent?: boolean } };
    expect(outcome.failed.neverSent).toBe(true);
    expect(answerLost(outcome.failed)).toBe(false);
    proxy.restore();
    expect(await rowsOf(id)).toBe(0);
  }, 30_000);

  it('an error PostgreSQL reports is not a lost answer; a broken connection or a silent one is', () => {
    const reported = Object.assign(new Error('canceling statement due to lock timeout'), {
      code: '55P03',
      severity: 'ERROR',
    });
    expect(answerLost(reported)).toBe(false);
    // The same in the server's own language (lc_messages): judged by its code.
    expect(answerLost(Object.assign(new Error('annulation'), { code: '55P03', severity: 'ERREUR' }))).toBe(
      false,
    );
    // A COMMIT on a client whose connection already failed: nothing was sent.
    expect(answerLost(new Error('Client has encountered a connection error and is not queryable'))).toBe(
      false,
    );
    expect(answerLost(new Error('Connection terminated unexpectedly'))).toBe(true);
    expect(answerLost(new Error('Query read timeout'))).toBe(true);
    expect(answerLost(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }))).toBe(true);
    // Never sent: the pool could not hand out a connection.
    expect(answerLost(new Error('timeout exceeded when trying to connect'))).toBe(false);
    // A pooler's own errors (PgBouncer's query_timeout, its server connection lost): the backend
    // behind it may go on and commit.
    for (const message of ['query timeout', 'server conn crashed?'])
      expect(answerLost(Object.assign(new Error(message), { code: '08P01', severity: 'FATAL' }))).toBe(true);
    // PostgreSQL ending the session (pg_terminate_backend): settled too, at the cost of a read.
    expect(
      answerLost(Object.assign(new Error('terminating connection'), { code: '57P01', severity: 'FATAL' })),
    ).toBe(true);
  });
});
