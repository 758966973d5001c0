import type { Database } from '@sluice/postgres/database';
import pg from 'pg';
import { expect, it } from 'vitest';
import { claimDefaultRun } from '../../src/runs/claims.js';
import { insertRuns } from '../../src/runs/lifecycle.js';
import { afterThisTest, freshDatabase, postgres, until } from '../helpers.js';
import { openDb, run, who } from '../limits/admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * Default-class claims take turns by tenant: the tenant whose last claim is oldest goes next,
 * and each tenant's runs go in arrival order. Real PostgreSQL; "two processes" are two stores,
 * each with its own pool, claiming at the same time.
 */

interface Queued {
  tenant: string;
  id: string;
}

/** Queues default-class runs, one per tenant named, in that order. */
async function queue(db: Database, tenants: string[]): Promise<Queued[]> {
  const runs = tenants.map((tenant, i) => ({ who: who(tenant), run: run({ input: `run ${i}` }) }));
  const rows = await db.transaction((tx) => insertRuns(tx, runs));
  return rows.map((row) => ({ tenant: row.tenant, id: row.id }));
}

const times = (tenant: string, n: number) => Array.from({ length: n }, () => tenant);
const idsOf = (runs: Queued[], tenant: string) => runs.filter((r) => r.tenant === tenant).map((r) => r.id);

async function claimAll(db: Database): Promise<Queued[]> {
  const claimed: Queued[] = [];
  for (let row = await claimDefaultRun(db, 'w1'); row; row = await claimDefaultRun(db, 'w1')) {
    claimed.push({ tenant: row.tenant, id: row.id });
  }
  return claimed;
}

describeWith({ PostgreSQL: postgres })('default-class claims, round-robin by tenant', () => {
  it('a tenant with 250 queued runs puts at most one ahead of another tenant arriving after them', async () => {
    const db = await openDb(await freshDatabase());
    const a = await queue(db, times('ta', 250));
    const [b] = await queue(db, ['tb']);
    const first = await claimDefaultRun(db, 'w1');
    const second = await claimDefaultRun(db, 'w1');
    expect([first?.id, second?.id]).toEqual([a[0]!.id, b!.id]);
    // Served first-in-first-out, b would have waited behind all 250. Then a's go on in order.
    const next = [];
    for (let i = 0; i < 12; i++) next.push((await claimDefaultRun(db, 'w1'))?.id);
    expect(next).toEqual(a.slice(1, 13).map((r) => r.id));
  });

  it("while a tenant's backlog is being served, each next run of another tenant waits behind at most one of it", async () => {
    const db = await openDb(await freshDatabase());
    await queue(db, times('ta', 250));
    for (let i = 0; i < 5; i++) expect((await claimDefaultRun(db, 'w1'))?.tenant).toBe('ta');
    const b = await queue(db, times('tb', 3));
    const next = [];
    for (let i = 0; i < 7; i++) next.push((await claimDefaultRun(db, 'w1'))!);
    expect(next.map((r) => r.tenant)).toEqual(['tb', 'ta', 'tb', 'ta', 'tb', 'ta', 'ta']);
    expect(next.filter((r) => r.tenant === 'tb').map((r) => r.id)).toEqual(b.map((r) => r.id));
  });

  it("a tenant whose runs all wait on a busy thread lets the next tenant's run go", async () => {
    const db = await openDb(await freshDatabase());
    await db.query(
      `INSERT INTO threads (id, tenant, project, user_id, active_run_id, lock_expires_at)
       VALUES ('thr_busy', 'ta', 'p', 'u', 'run_elsewhere', clock_timestamp() + interval '1 hour')`,
    );
    await db.transaction((tx) =>
      insertRuns(tx, [
        { who: who('ta'), run: run({ threadId: 'thr_busy' }) },
        { who: who('ta'), run: run({ threadId: 'thr_busy' }) },
      ]),
    );
    const [b] = await queue(db, ['tb']);
    expect((await claimDefaultRun(db, 'w1'))?.id).toBe(b!.id);
    expect(await claimDefaultRun(db, 'w1')).toBeUndefined();
  });

  it('two processes claiming at once: no run is claimed twice, and each round serves both tenants', async () => {
    const url = await freshDatabase();
    const one = await openDb(url);
    const two = await openDb(url);
    const a = await queue(one, times('ta', 40));
    const b = await queue(one, times('tb', 15));
    const claimed: Queued[] = [];
    for (;;) {
      const round = (await Promise.all([claimDefaultRun(one, 'w1'), claimDefaultRun(two, 'w2')])).filter(
        (row) => row !== undefined,
      );
      if (round.length === 0) break;
      // While both tenants have runs queued, two claims at once go one to each.
      if (claimed.filter((r) => r.tenant === 'tb').length < b.length - 1) {
        expect(round.map((r) => r.tenant).sort()).toEqual(['ta', 'tb']);
      }
      // Claims for one tenant are one after the other: the later one started later.
      round.sort((x, y) => x.started_at! - y.started_at!);
      claimed.push(...round.map((row) => ({ tenant: row.tenant, id: row.id })));
    }
    expect(new Set(claimed.map((r) => r.id)).size).toBe(claimed.length);
    expect(claimed).toHaveLength(a.length + b.length);
    expect(idsOf(claimed, 'ta')).toEqual(a.map((r) => r.id));
    expect(idsOf(claimed, 'tb')).toEqual(b.map((r) => r.id));
    const running = await one.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM agent_runs WHERE status = 'running' AND worker IN ('w1', 'w2')`,
    );
    expect(running.rows[0]!.n).toBe(a.length + b.length);
  });

  it('a claim that finds the only waiting tenant being claimed for waits for it instead of reporting an empty queue', async () => {
    const url = await freshDatabase();
    const db = await openDb(url);
    const a = await queue(db, times('ta', 3));
    // Another process mid-claim for ta: its transaction holds ta's turn lock.
    const other = new pg.Client(url);
    await other.connect();
    afterThisTest(() => other.end());
    await other.query('BEGIN');
    await other.query(`SELECT pg_advisory_xact_lock(hashtext('sluice:claim:default:' || 'ta'))`);
    const claim = claimDefaultRun(db, 'w1');
    await until(
      async () =>
        (
          await db.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          )
        ).rows[0]!.n === 1,
      'the claim waits on the lock',
    );
    await other.query('COMMIT');
    expect((await claim)?.id).toBe(a[0]!.id);
  });

  it('eight claimers on two processes racing over one queue claim each run exactly once', async () => {
    const url = await freshDatabase();
    const stores = [await openDb(url), await openDb(url)];
    const admitted = await queue(
      stores[0]!,
      Array.from({ length: 120 }, (_, i) => `t${i % 6}`),
    );
    const claimed: Queued[] = [];
    await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        const db = stores[i % 2]!;
        for (let row = await claimDefaultRun(db, `w${i}`); row; row = await claimDefaultRun(db, `w${i}`)) {
          claimed.push({ tenant: row.tenant, id: row.id });
        }
      }),
    );
    expect(claimed.map((r) => r.id).sort()).toEqual(admitted.map((r) => r.id).sort());
  }, 30_000);

  it('three tenants with more than ten runs each, queued unevenly: turns by tenant, arrival order within each', async () => {
    const db = await openDb(await freshDatabase());
    // ta's 14 first, then tb and tc interleaved, 12 and 11: the order of their heads is ta, tb, tc.
    const admitted = [
      ...(await queue(db, times('ta', 14))),
      ...(await queue(
        db,
        Array.from({ length: 23 }, (_, i) => (i % 2 === 0 ? 'tb' : 'tc')),
      )),
    ];
    const claimed = await claimAll(db);
    expect(claimed).toHaveLength(admitted.length);
    for (const tenant of ['ta', 'tb', 'tc']) expect(idsOf(claimed, tenant)).toEqual(idsOf(admitted, tenant));
    // 11 full rounds, then ta and tb alone, then ta alone.
    const rounds = [...times('ta tb tc', 11), 'ta tb', 'ta', 'ta'].join(' ').split(' ');
    expect(claimed.map((r) => r.tenant)).toEqual(rounds);
  });
});
