import type { Database, SqlClient } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { claimDefaultRun, claimDeferredRun } from '../../src/runs/claims.js';
import { failLostRuns, finishRun, insertRuns } from '../../src/runs/lifecycle.js';
import type { RunClass } from '../../src/runs/states.js';
import { deferred } from '../harness/deferred.js';
import { until } from '../harness/index.js';
import { freshDatabase, postgres } from '../helpers.js';
import { openDb, run, who } from '../limits/admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * Workers take queued runs in the order they were admitted (`seq`). The claim selects `seq` as
 * text, so a query that sorted by that text would serve 1, 10, 11, ..., 19, 2, 20: from the tenth
 * run of a fresh database on, claims would leave arrival order. Two tenants interleaved, so the
 * order asserted is the one within each tenant as well as the one across them.
 */

const QUEUED_PER_TENANT = 14;

/** 2 x QUEUED_PER_TENANT queued runs of `cls`, tenants alternating, in one admission order. */
async function queue(db: Database, cls: RunClass): Promise<{ tenant: string; id: string }[]> {
  const runs = Array.from({ length: 2 * QUEUED_PER_TENANT }, (_, i) => ({
    who: who(i % 2 === 0 ? 'ta' : 'tb'),
    run: run({ class: cls, input: `run ${i}` }),
  }));
  const rows = await db.transaction((tx) => insertRuns(tx, runs));
  return rows.map((row) => ({ tenant: row.tenant, id: row.id }));
}

const ofTenant = (runs: { tenant: string; id: string }[], tenant: string) =>
  runs.filter((r) => r.tenant === tenant).map((r) => r.id);

describeWith({ PostgreSQL: postgres })('claims serve each queue in admission order', () => {
  it(`default class: ${2 * QUEUED_PER_TENANT} queued runs are claimed oldest first, within each tenant too`, async () => {
    const db = await openDb(await freshDatabase());
    const admitted = await queue(db, 'default');
    const claimed: { tenant: string; id: string }[] = [];
    for (let i = 0; i < admitted.length; i++) {
      const row = await claimDefaultRun(db, 'w1');
      claimed.push({ tenant: row!.tenant, id: row!.id });
    }
    expect(await claimDefaultRun(db, 'w1')).toBeUndefined();
    expect(ofTenant(claimed, 'ta')).toEqual(ofTenant(admitted, 'ta'));
    expect(ofTenant(claimed, 'tb')).toEqual(ofTenant(admitted, 'tb'));
    expect(claimed).toEqual(admitted);
  });

  it('deferred class, no running cap: claimed oldest first', async () => {
    const db = await openDb(await freshDatabase());
    const admitted = await queue(db, 'deferred');
    const claimed: string[] = [];
    for (let i = 0; i < admitted.length; i++) claimed.push((await claimDeferredRun(db, 'w1', 0))!.id);
    expect(claimed).toEqual(admitted.map((r) => r.id));
  });

  it('deferred class under a running cap of 1: each tenant runs its queue in admission order', async () => {
    const db = await openDb(await freshDatabase());
    const admitted = await queue(db, 'deferred');
    const claimed: { tenant: string; id: string }[] = [];
    for (;;) {
      // Two claims while both tenants hold their one place: the second finds nobody with room.
      const first = await claimDeferredRun(db, 'w1', 1);
      if (!first) break;
      const second = await claimDeferredRun(db, 'w1', 1);
      const third = await claimDeferredRun(db, 'w1', 1);
      expect(third).toBeUndefined();
      for (const row of [first, second]) {
        if (!row) continue;
        claimed.push({ tenant: row.tenant, id: row.id });
        await finishRun(db, row.id, 'w1', { status: 'succeeded', output: 'ok' });
      }
    }
    expect(claimed).toHaveLength(admitted.length);
    expect(ofTenant(claimed, 'ta')).toEqual(ofTenant(admitted, 'ta'));
    expect(ofTenant(claimed, 'tb')).toEqual(ofTenant(admitted, 'tb'));
  });
});

describeWith({ PostgreSQL: postgres })('the deferred running cap under claims at once', () => {
  it('16 claimers on two pools at once start exactly the cap of a tenant with a backlog, and every run of the others', async () => {
    const url = await freshDatabase();
    const [one, two] = [await openDb(url), await openDb(url)];
    const CAP = 3;
    // ta has 20 queued runs ahead of tb's 4: the claims that find ta full must reach tb.
    const runs = [
      ...Array.from({ length: 20 }, (_, i) => ({
        who: who('ta'),
        run: run({ class: 'deferred', input: `a ${i}` }),
      })),
      ...Array.from({ length: 4 }, (_, i) => ({
        who: who('tb'),
        run: run({ class: 'deferred', input: `b ${i}` }),
      })),
    ];
    await one.transaction((tx) => insertRuns(tx, runs));
    const claims = await Promise.all(
      Array.from({ length: 16 }, (_, i) => claimDeferredRun(i % 2 === 0 ? one : two, `w${i % 2}`, CAP)),
    );
    const started = claims.filter((row) => row !== undefined);
    const running = async (tenant: string) =>
      (
        await one.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1 AND class = 'deferred' AND status = 'running'`,
          [tenant],
        )
      ).rows[0]!.n;
    // Every claimer that could start a run did: ta's cap and tb's cap, nothing more.
    expect(started.filter((row) => row.tenant === 'ta')).toHaveLength(CAP);
    expect(started.filter((row) => row.tenant === 'tb')).toHaveLength(CAP);
    expect(await running('ta')).toBe(CAP);
    expect(await running('tb')).toBe(CAP);
    // A run of ta ends: the next claim takes ta's oldest queued run, and the one after finds ta full.
    const ended = started.find((row) => row.tenant === 'ta')!;
    await finishRun(one, ended.id, ended.worker!, { status: 'succeeded', output: 'ok' });
    const next = await claimDeferredRun(two, 'w1', CAP);
    expect(next?.tenant).toBe('ta');
    expect(await claimDeferredRun(one, 'w0', CAP)).toBeUndefined();
    expect(await running('ta')).toBe(CAP);
  });
});

describeWith({ PostgreSQL: postgres })('deferred claims against the other writers', () => {
  it("a thread's next run claimed while the lost-worker sweep ends the run before it: both go through, no deadlock", async () => {
    const db = await openDb(await freshDatabase());
    await db.query(`INSERT INTO threads (id, tenant, project, user_id) VALUES ('th1', 'ta', 'p', 'u')`);
    const [lost, next] = await db.transaction((tx) =>
      insertRuns(tx, [
        { who: who('ta'), run: run({ class: 'deferred', input: 'first', threadId: 'th1' }) },
        { who: who('ta'), run: run({ class: 'deferred', input: 'next', threadId: 'th1' }) },
      ]),
    );
    // The first run's process died: it is running, and its hold on the thread has run out.
    await db.query(
      `UPDATE agent_runs SET status = 'running', worker = 'node_dead', started_at = now() - interval '1 minute'
       WHERE id = $1::text`,
      [lost!.id],
    );
    await db.query(
      `UPDATE threads SET active_run_id = $1::text, lock_expires_at = now() - interval '1 second' WHERE id = 'th1'`,
      [lost!.id],
    );
    // The claim's transaction stops just before its start (it holds the thread's row by then)...
    const atStart = deferred();
    const gate = deferred();
    const gated = {
      query: db.query.bind(db),
      transaction: <T>(body: (tx: SqlClient) => Promise<T>) =>
        db.transaction((tx) =>
          body({
            query: async (text: string, params?: unknown[]) => {
              if (/^\s*UPDATE agent_runs SET status = 'running'/.test(text)) {
                atStart.resolve();
                await gate.promise;
              }
              return tx.query(text, params);
            },
          } as SqlClient),
        ),
    } as unknown as Database;
    const claim = claimDeferredRun(gated, 'node_live', 2);
    await atStart.promise;
    // ...while the sweep ends the first run (its counts change, then its thread is let go).
    const sweep = failLostRuns(db, 10_000);
    const sweepWaits = await Promise.race([
      sweep.then(() => false),
      until(async () => (await lockWaiters(db)) > 0).then(() => true),
    ]);
    expect(sweepWaits).toBe(true);
    gate.resolve();
    expect((await claim)?.id).toBe(next!.id);
    expect(await sweep).toBe(1);
  });

  it('on a database whose default isolation is REPEATABLE READ, 12 claims at once start exactly the cap of 10', async () => {
    const url = await freshDatabase();
    const setup = await openDb(url);
    const name = (await setup.query<{ d: string }>('SELECT current_database() AS d')).rows[0]!.d;
    await setup.query(`ALTER DATABASE "${name}" SET default_transaction_isolation = 'repeatable read'`);
    const [one, two] = [await openDb(url), await openDb(url)];
    await one.transaction((tx) =>
      insertRuns(
        tx,
        Array.from({ length: 20 }, (_, i) => ({
          who: who('ta'),
          run: run({ class: 'deferred', input: `r ${i}` }),
        })),
      ),
    );
    const claims = await Promise.all(
      Array.from({ length: 12 }, (_, i) => claimDeferredRun(i % 2 ? one : two, `w${i}`, 10)),
    );
    expect(claims.filter((row) => row !== undefined)).toHaveLength(10);
  });
});

/** Sessions of this database waiting for a lock now. */
async function lockWaiters(db: Database): Promise<number> {
  return (
    await db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
       WHERE NOT l.granted AND a.datname = current_database()`,
    )
  ).rows[0]!.n;
}
