import pg from 'pg';
import type { Database } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { admitRun, type Admission } from '../../src/runs/admission.js';
import { afterThisTest, freshDatabase, postgres, until } from '../helpers.js';
import { limits, who, run, openDb } from './admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/*
 * The fast path (sluice_admit_runs): two stores on one database stand for two
 * `sluice serve` processes. A third session holds the tenant's admission lock while both
 * processes' batches reach the lock, so both decide from the same plain read, and the order in
 * which they get the lock is the only thing left to chance (and the checks hold either way).
 */

/** A session of its own holding the tenant's admission lock until `release`. */
async function holdTenantLock(databaseUrl: string, tenant: string) {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  afterThisTest(() => client.end());
  await client.query('SELECT pg_advisory_lock(hashtext($1::text))', [`sluice:tenant:${tenant}`]);
  return {
    /** Waits until `n` sessions wait for an advisory lock (the batches are at the lock). */
    waiters: (n: number) =>
      until(
        async () =>
          (
            await client.query<{ n: number }>(
              `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
            )
          ).rows[0]!.n >= n,
        `${n} sessions waiting for the admission lock`,
      ),
    release: () => client.query('SELECT pg_advisory_unlock(hashtext($1::text))', [`sluice:tenant:${tenant}`]),
  };
}

type Settled = { ok: true; admission: Admission } | { ok: false; error: unknown };
const settle = (p: Promise<Admission>): Promise<Settled> =>
  p.then(
    (admission) => ({ ok: true as const, admission }),
    (error: unknown) => ({ ok: false as const, error }),
  );

async function truth(db: Database, tenant: string) {
  return (
    await db.query<{ project: string; active: number; scheduled: number; deferred: number }>(
      `SELECT k.project,
              count(*) FILTER (WHERE class = 'default' AND status IN ('queued', 'running'))::int AS active,
              count(*) FILTER (WHERE class = 'default' AND status = 'scheduled')::int AS scheduled,
              count(*) FILTER (WHERE class = 'deferred' AND status IN ('queued', 'scheduled'))::int AS deferred
       FROM agent_runs r, LATERAL (VALUES (''), (r.project)) AS k(project)
       WHERE tenant = $1::text AND status IN ('scheduled', 'queued', 'running') GROUP BY k.project ORDER BY k.project`,
      [tenant],
    )
  ).rows;
}

describeWith({ PostgreSQL: postgres })('the fast path across two processes', () => {
  it('two processes deciding from the same plain read never pass the tenant cap (default isolation)', async () => {
    const url = await freshDatabase();
    const [a, b] = [await openDb(url), await openDb(url)];
    const t = 'two';
    const cap = limits({ activePerTenant: 5 });
    // One admission each first: the line's first batch reconciles under the lock; later ones may take the fast path.
    for (const db of [a, b]) expect((await admitRun(db, who(t, 'p0'), run(), cap)).ok).toBe(true);
    const lock = await holdTenantLock(url, t);
    const calls = [a, a, b, b].map((db) => settle(admitRun(db, who(t, 'p1'), run(), cap)));
    await lock.waiters(2);
    await lock.release();
    const outcomes = await Promise.all(calls);
    expect(outcomes.every((o) => o.ok)).toBe(true);
    const admitted = outcomes.filter((o) => o.ok && o.admission.ok).length;
    expect(admitted).toBe(3);
    expect((await truth(a, t)).find((r) => r.project === '')?.active).toBe(5);
  }, 30_000);

  it('mixed batches (default, deferred, scheduled; projects with no counter row yet) stay within every cap', async () => {
    const url = await freshDatabase();
    const [a, b] = [await openDb(url), await openDb(url)];
    const t = 'mixed';
    const cap = limits({ activePerTenant: 4, activePerProject: 2, deferredQueued: 2, scheduled: 2 });
    for (const db of [a, b]) expect((await admitRun(db, who(t, 'p0'), run(), cap)).ok).toBe(true);
    const lock = await holdTenantLock(url, t);
    const batch = (db: Database) => [
      settle(admitRun(db, who(t, 'p1'), run(), cap)),
      settle(admitRun(db, who(t, 'p2'), run(), cap)),
      settle(admitRun(db, who(t, 'p1'), run({ class: 'deferred' }), cap)),
      settle(admitRun(db, who(t, 'p2'), run({ schedule: { delayMs: 3_600_000 } }), cap)),
      settle(admitRun(db, who(t, 'p1'), run({ schedule: { delayMs: 3_600_000 } }), cap)),
      settle(admitRun(db, who(t, 'p1'), run({ mode: 'inline', worker: 'w2' }), cap)),
    ];
    const calls = [...batch(a), ...batch(b)];
    await lock.waiters(2);
    await lock.release();
    const outcomes = await Promise.all(calls);
    expect(outcomes.filter((o) => !o.ok)).toEqual([]);
    const rows = await truth(a, t);
    const tenant = rows.find((r) => r.project === '')!;
    // Active: 2 earlier + 2 (p2) + 2 (p1; the per-project cap) = 4 at most, and exactly the cap.
    expect(tenant.active).toBe(4);
    expect(tenant.deferred).toBe(2);
    expect(tenant.scheduled).toBe(2);
    for (const r of rows) if (r.project !== '') expect(r.active).toBeLessThanOrEqual(2);
    // The counters agree with the truth.
    const counters = await a.query(
      `SELECT project, default_active AS active, default_scheduled AS scheduled, deferred_waiting AS deferred
       FROM admission_counters WHERE tenant = $1::text ORDER BY project`,
      [t],
    );
    expect(counters.rows).toEqual(rows);
  }, 30_000);

  it('with default_transaction_isolation = repeatable read on the database, concurrent batches of two processes are still admitted', async () => {
    // An operator setting: ALTER DATABASE ... SET default_transaction_isolation. The locked
    // transaction states READ COMMITTED (database.ts); the fast path's single statement runs in
    // the session's default, so its check reads the snapshot taken before it waited for the lock.
    const url = await freshDatabase();
    const name = /@\/(\w+)/.exec(url)![1]!;
    const admin = new pg.Client({ ...postgres });
    await admin.connect();
    await admin.query(`ALTER DATABASE ${name} SET default_transaction_isolation = 'repeatable read'`);
    await admin.end();
    const [a, b] = [await openDb(url), await openDb(url)];
    const t = 'rr';
    const none = limits();
    for (const db of [a, b]) expect((await admitRun(db, who(t, 'p0'), run(), none)).ok).toBe(true);
    const lock = await holdTenantLock(url, t);
    const calls = [a, b].map((db) => settle(admitRun(db, who(t, 'p1'), run(), none)));
    await lock.waiters(2);
    await lock.release();
    const outcomes = await Promise.all(calls);
    const errors = outcomes.flatMap((o) => (o.ok ? [] : [String((o.error as { code?: string }).code)]));
    // Fails today: one process's admission errors with 40001 (could not serialize access).
    expect(errors).toEqual([]);
    expect(outcomes.every((o) => o.ok && o.admission.ok)).toBe(true);
  }, 30_000);
});
