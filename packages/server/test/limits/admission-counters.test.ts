import type { Database } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { ManualClock } from 'sluice/concurrency';
import { admitRun, RECONCILE_EVERY_MS, type Admission } from '../../src/runs/admission.js';
import { reconcileDrifted } from '../../src/runs/admission-counts.js';
import { claimDefaultRun, claimDeferredRun } from '../../src/runs/claims.js';
import {
  admitDecided,
  cancelNotStarted,
  expireRuns,
  failLostRuns,
  finishRun,
  insertRuns,
  interruptRuns,
} from '../../src/runs/lifecycle.js';
import { promoteDueRuns } from '../../src/runs/scheduler.js';
import { newRunId, type NewRun } from '../../src/runs/store.js';
import { freshDatabase, postgres, until } from '../helpers.js';
import { limits, who, run, openDb } from './admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/** The tenant's counter rows beside the true counts of its runs: they must be equal. */
async function expectExact(db: Database, tenant: string) {
  const [counters, truth] = await Promise.all([
    db.query(
      `SELECT project, default_active, default_scheduled, deferred_waiting, deferred_running FROM admission_counters
       WHERE tenant = $1::text AND (default_active, default_scheduled, deferred_waiting, deferred_running) <> (0, 0, 0, 0)
       ORDER BY project`,
      [tenant],
    ),
    db.query(
      `SELECT k.project,
              count(*) FILTER (WHERE class = 'default' AND status IN ('queued', 'running'))::int AS default_active,
              count(*) FILTER (WHERE class = 'default' AND status = 'scheduled')::int AS default_scheduled,
              count(*) FILTER (WHERE class = 'deferred' AND status IN ('queued', 'scheduled'))::int AS deferred_waiting,
              count(*) FILTER (WHERE class = 'deferred' AND status = 'running')::int AS deferred_running
       FROM agent_runs r, LATERAL (VALUES (''), (r.project)) AS k(project)
       WHERE tenant = $1::text AND status IN ('scheduled', 'queued', 'running') GROUP BY k.project ORDER BY k.project`,
      [tenant],
    ),
  ]);
  expect(counters.rows).toEqual(truth.rows);
  return counters.rows as { project: string; default_active: number }[];
}

const admittedId = (a: Admission) => {
  if (!a.ok) throw new Error(`refused: ${JSON.stringify(a.refusal)}`);
  return a.run.id;
};

describeWith({ PostgreSQL: postgres })('admission counters on PostgreSQL', () => {
  it('every way a run enters or leaves a counted set keeps the counters equal to the true counts', async () => {
    const db = await openDb(await freshDatabase());
    const t = 'paths';
    const admit = async (r: NewRun, project = 'p') =>
      admittedId(await admitRun(db, who(t, project), r, limits()));
    const queued = await Promise.all(Array.from({ length: 6 }, (_, i) => admit(run(), i % 2 ? 'p' : 'q')));
    const inline = await admit(run({ mode: 'inline', worker: 'w2' }));
    await admit(run({ class: 'deferred' }));
    await admit(run({ class: 'deferred' }));
    const deferredLater = await admit(run({ class: 'deferred', schedule: { delayMs: 3_600_000 } }));
    await admit(run({ schedule: { delayMs: 0 } }), 'q');
    await admit(run({ schedule: { delayMs: 3_600_000 } }));
    expect(await expectExact(db, t)).toContainEqual(
      expect.objectContaining({ project: '', default_active: 7 }),
    );

    // Claimed (queued to running: no change), then finished.
    const claimed = await claimDefaultRun(db, 'w1');
    const rest = queued.filter((id) => id !== claimed!.id);
    await expectExact(db, t);
    await finishRun(db, claimed!.id, 'w1', { status: 'succeeded', output: 'ok' });
    await expectExact(db, t);
    // A deferred run claimed (queued to running: it leaves the waiting count for the running
    // one), then finished.
    const deferredClaimed = await claimDeferredRun(db, 'w1', 2);
    expect(deferredClaimed?.class).toBe('deferred');
    expect(await expectExact(db, t)).toContainEqual(
      expect.objectContaining({ project: '', deferred_running: 1 }),
    );
    await finishRun(db, deferredClaimed!.id, 'w1', { status: 'succeeded', output: 'ok' });
    await expectExact(db, t);
    // Canceled while queued, and while scheduled.
    await cancelNotStarted(db, t, rest[0]!);
    await cancelNotStarted(db, t, deferredLater);
    await expectExact(db, t);
    // A due scheduled run promoted to queued.
    expect(await promoteDueRuns(db, () => limits())).toBe(1);
    await expectExact(db, t);
    // Paused for an approval (leaves the set), resumed (enters it again, uncapped).
    await db.query(`UPDATE agent_runs SET status = 'requires_action' WHERE id = $1::text`, [rest[1]]);
    await expectExact(db, t);
    await db.query(`UPDATE agent_runs SET status = 'running', worker = 'w1' WHERE id = $1::text`, [rest[1]]);
    await expectExact(db, t);
    // Interrupted at shutdown, lost with its worker, expired in the deferred queue.
    expect(await interruptRuns(db, 'w1', [rest[1]!])).toEqual([rest[1]]);
    await expectExact(db, t);
    expect(await failLostRuns(db, 0)).toBeGreaterThanOrEqual(1); // w2 never heartbeats: the inline run
    const lost = await db.query<{ status: string }>(`SELECT status FROM agent_runs WHERE id = $1::text`, [
      inline,
    ]);
    expect(lost.rows[0]!.status).toBe('failed');
    await expectExact(db, t);
    expect(await expireRuns(db, 0)).toBe(1); // the queued deferred one
    await expectExact(db, t);
    // Deleted while active (a manual cleanup): the place comes back too.
    await db.query(`DELETE FROM agent_runs WHERE id = $1::text`, [rest[2]]);
    await expectExact(db, t);
  }, 60_000);

  it("a deferred running count that drifted high is set right by upkeep's look, and the tenant's queued run is claimed", async () => {
    const db = await openDb(await freshDatabase());
    const t = 'drift';
    const queued = admittedId(await admitRun(db, who(t, 'p'), run({ class: 'deferred' }), limits()));
    // A manual edit says two of the tenant's deferred runs are running; none is.
    await db.query(`UPDATE admission_counters SET deferred_running = 2 WHERE tenant = $1::text`, [t]);
    // The claims trust the count: the tenant is at its cap of 2 for them.
    expect(await claimDeferredRun(db, 'w1', 2)).toBeUndefined();
    expect(await reconcileDrifted(db)).toEqual([t]);
    await expectExact(db, t);
    expect((await claimDeferredRun(db, 'w1', 2))?.id).toBe(queued);
    // Nothing differs now: the next look sets nobody right.
    expect(await reconcileDrifted(db)).toEqual([]);
  }, 60_000);

  it('an admission batch and a finishing run lock the counter rows in one order, whatever the plan (no deadlock)', async () => {
    const db = await openDb(await freshDatabase());
    const t = 'order';
    const ended = admittedId(await admitRun(db, who(t, 'q'), run(), limits()));
    await admitRun(db, who(t, 'p'), run(), limits());
    // A small table with statistics is read by a sequential scan, in physical order; moving the
    // tenant's row ('') behind its projects' rows makes that order differ from the key order.
    await db.query(`UPDATE admission_counters SET tenant = tenant WHERE tenant = $1::text AND project = ''`, [
      t,
    ]);
    await db.query('ANALYZE admission_counters');
    const waiting = (pid: number) => async () =>
      (
        await db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_locks WHERE pid = $1::int AND NOT granted`,
          [pid],
        )
      ).rows[0]!.n > 0;
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let finisherPid = 0;
    let batchPid = 0;
    let finishing: Promise<unknown> | undefined;
    // The batch: runs in p then q, in one transaction (as one admission batch's INSERT would).
    const batch = db.transaction(async (tx) => {
      batchPid = (await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      await insertRuns(tx, [{ who: who(t, 'p'), run: run() }]);
      // Meanwhile a run of project q finishes (no admission lock: finishing never takes it).
      finishing = db.transaction(async (f) => {
        finisherPid = (await f.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
        await f.query(
          `UPDATE agent_runs SET status = 'succeeded', finished_at = clock_timestamp() WHERE id = $1::text`,
          [ended],
        );
      });
      await until(
        async () => finisherPid > 0 && (await waiting(finisherPid)()),
        'the finish waiting for a lock',
      );
      await insertRuns(tx, [{ who: who(t, 'q'), run: run() }]);
      await held;
    });
    await until(
      async () => batchPid > 0 && !(await waiting(batchPid)()) && finishing !== undefined,
      'the batch',
    );
    release();
    await Promise.all([batch, finishing]);
    await expectExact(db, t);
  }, 60_000);

  it("a new tenant's first runs, inserted at once from two connections, are each counted in its row and their projects'", async () => {
    const db = await openDb(await freshDatabase());
    // Two statements at once, each its own transaction: neither finds the tenant's row ('') when
    // it starts. A look for the row made apart from the UPDATE that missed it, after the other
    // committed, dropped the change (a few tenants in a few hundred, before 036's last form).
    const tenants = Array.from({ length: 600 }, (_, i) => `first-${i}`);
    for (const tenant of tenants) {
      await Promise.all(
        ['p1', 'p2'].map((project) => insertRuns(db, [{ who: who(tenant, project), run: run() }])),
      );
    }
    const { rows } = await db.query<{ tenant: string; active: number }>(
      `SELECT tenant, default_active AS active FROM admission_counters WHERE project = '' AND tenant = ANY($1::text[])`,
      [tenants],
    );
    expect(rows.filter((r) => r.active !== 2)).toEqual([]);
    expect(rows).toHaveLength(tenants.length);
    for (const tenant of tenants.slice(0, 5)) await expectExact(db, tenant);
  }, 120_000);

  it('a run the database refuses as data fails alone: the runs batched with it are admitted', async () => {
    const db = await openDb(await freshDatabase());
    const t = 'bad-one';
    const capped = limits({ activePerTenant: 3 });
    const [a, bad, b] = await Promise.allSettled([
      admitRun(db, who(t), run(), capped),
      // Out of PostgreSQL's timestamp range: the INSERT of the whole batch fails on it.
      admitRun(db, who(t), run({ schedule: { atMs: 1e300 } }), capped),
      admitRun(db, who(t), run(), capped),
    ]);
    expect(a).toMatchObject({ status: 'fulfilled', value: { ok: true } });
    expect(b).toMatchObject({ status: 'fulfilled', value: { ok: true } });
    expect(bad).toMatchObject({ status: 'rejected', reason: { code: '22008' } });
    expect((await expectExact(db, t))[0]).toMatchObject({ project: '', default_active: 2 });
  }, 60_000);

  it('400 concurrent admissions through two handles (two processes), cap 50, project cap 30: exactly the caps, counted exactly', async () => {
    const url = await freshDatabase();
    const [one, two] = [await openDb(url), await openDb(url)];
    const capped = limits({ activePerTenant: 50, activePerProject: 30 });
    const results = await Promise.all(
      Array.from({ length: 400 }, (_, i) =>
        admitRun(i % 2 ? one : two, who('burst', i % 3 ? 'a' : 'b'), run(), capped),
      ),
    );
    const admitted = results.filter((r) => r.ok);
    expect(admitted.length).toBe(50);
    const rows = await expectExact(one, 'burst');
    expect(rows.find((r) => r.project === 'a')!.default_active).toBeLessThanOrEqual(30);
    expect(rows.find((r) => r.project === 'b')!.default_active).toBeLessThanOrEqual(30);
    for (const r of results) {
      if (!r.ok) expect(r.refusal).toMatchObject({ kind: 'concurrency', limit: 'max_active_runs' });
    }
  }, 60_000);

  it('a batch decided from a plain read is written only while the counts leave it room; a stale decision writes nothing', async () => {
    const db = await openDb(await freshDatabase());
    const t = 'decided';
    await insertRuns(db, [{ who: who(t), run: run() }]);
    // Cap 3 with one run: a batch of two fits while the count is at most 1.
    const highest = [
      { project: '', active: 1, scheduled: null, deferred: null },
      { project: 'p', active: null, scheduled: null, deferred: null },
    ];
    const ids = [newRunId(), newRunId()];
    const rows = await admitDecided(
      db,
      t,
      highest,
      ids.map((id, i) => ({ who: who(t), run: run({ id, metadata: i === 0 ? null : undefined }) })),
    );
    expect(rows?.map((r) => r.id)).toEqual(ids);
    // In the order given, a JSON null kept as one and a missing value as SQL NULL, as the INSERT did.
    const stored = await db.query<{ id: string; meta: string | null }>(
      `SELECT id, metadata::text AS meta FROM agent_runs WHERE id = ANY($1::text[]) ORDER BY seq`,
      [ids],
    );
    expect(stored.rows).toEqual([
      { id: ids[0], meta: 'null' },
      { id: ids[1], meta: null },
    ]);
    // The same decision again is stale (the count is 3 now): nothing is written.
    expect(await admitDecided(db, t, highest, [{ who: who(t), run: run() }])).toBeUndefined();
    expect((await expectExact(db, t))[0]).toMatchObject({ project: '', default_active: 3 });
  }, 60_000);

  it('a counter that drifted is set right within RECONCILE_EVERY_MS, even while plain reads say the cap is full', async () => {
    const db = await openDb(await freshDatabase());
    const clock = new ManualClock();
    const capped = limits({ activePerTenant: 2 });
    const admit = () => admitRun(db, who('drift'), run(), capped, 15_000, clock);
    admittedId(await admit());
    // Drifted up (a manual edit): the tenant looks full with one run.
    await db.query(`UPDATE admission_counters SET default_active = 2 WHERE tenant = 'drift'`);
    const refused = await admit();
    expect(refused).toMatchObject({ ok: false, refusal: { kind: 'concurrency', active: 2 } });
    clock.advance(RECONCILE_EVERY_MS);
    admittedId(await admit());
    await expectExact(db, 'drift');
    // Drifted down (rows lost), with the interval over: set right before the cap is checked, so it holds.
    await db.query(`DELETE FROM admission_counters WHERE tenant = 'drift'`);
    clock.advance(RECONCILE_EVERY_MS);
    expect(await admit()).toMatchObject({ ok: false, refusal: { limitValue: 2, active: 2 } });
    await expectExact(db, 'drift');
  }, 60_000);
});
