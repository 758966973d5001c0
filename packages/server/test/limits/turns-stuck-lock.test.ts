import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { admitRun, MAX_BATCH, type Admission } from '../../src/runs/admission.js';
import { afterThisTest, freshDatabase, postgres, preparedDataDir } from '../helpers.js';
import { limits, who, run } from './admission-fixtures.js';
import { itWith } from '../../../../scripts/service-suites.js';

/*
 * Turns: one turn is asked for per tenant and takes every queued run. A
 * stuck lock must still settle every caller (none left waiting for ever), and the line must
 * work again once the lock is free. And the fast path on embedded PGlite (one connection).
 */
const settle = (p: Promise<Admission>) =>
  p.then(
    (a) => ({ ok: true as const, a }),
    (error: unknown) => ({ ok: false as const, code: (error as { code?: string }).code }),
  );

describe('turns and the fast path', () => {
  itWith({ PostgreSQL: postgres })(
    'a stuck lock settles every caller of a burst larger than two batches, and the line works again after',
    async () => {
      const url = await freshDatabase();
      const dir = mkdtempSync(join(tmpdir(), 'sluice-r15-'));
      const store = await openStore({ databaseUrl: url, dataDir: dir, statementTimeoutMs: 1_000 });
      afterThisTest(async () => {
        await store.close();
        rmSync(dir, { recursive: true, force: true });
      });
      const db = store.db;
      const t = 'stuck';
      expect((await admitRun(db, who(t), run(), limits(), 1_000)).ok).toBe(true);
      const blocker = new pg.Client({ connectionString: url });
      await blocker.connect();
      afterThisTest(() => blocker.end());
      await blocker.query('SELECT pg_advisory_lock(hashtext($1::text))', [`sluice:tenant:${t}`]);
      const n = MAX_BATCH * 2 + 50;
      const outcomes = await Promise.all(
        Array.from({ length: n }, () => settle(admitRun(db, who(t), run(), limits(), 1_000))),
      );
      // Every caller answered: none admitted while the lock is held, each failed as a lock wait
      // (55P03) or as the statement timeout that races it (57014): both are answered 503.
      expect(outcomes.filter((o) => o.ok)).toEqual([]);
      for (const o of outcomes) expect(['55P03', '57014']).toContain(o.ok ? 'ok' : o.code);
      await blocker.query('SELECT pg_advisory_unlock(hashtext($1::text))', [`sluice:tenant:${t}`]);
      const after = await Promise.all(
        Array.from({ length: 5 }, () => settle(admitRun(db, who(t), run(), limits(), 1_000))),
      );
      expect(after.every((o) => o.ok && o.a.ok)).toBe(true);
      const count = await db.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1::text`,
        [t],
      );
      expect(count.rows[0]!.n).toBe(6);
    },
    30_000,
  );

  it('on embedded PGlite a burst is admitted up to the cap exactly, in arrival order', async () => {
    const dir = await preparedDataDir();
    // The template's copy is in dir/db (a store opened on dir itself would initdb a new one).
    const store = await openStore({ dataDir: join(dir, 'db') });
    afterThisTest(async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    });
    const db = store.db;
    const t = 'lite';
    const cap = limits({ activePerTenant: 20, activePerProject: 12 });
    // The first batch reconciles under the lock; the rest may take the fast path.
    expect((await admitRun(db, who(t, 'a'), run(), cap)).ok).toBe(true);
    const projects = Array.from({ length: 60 }, (_, i) => (i % 3 === 0 ? 'a' : i % 3 === 1 ? 'b' : 'c'));
    const outcomes = await Promise.all(
      projects.map((p, i) => settle(admitRun(db, who(t, p), run({ input: `#${i}` }), cap))),
    );
    expect(outcomes.filter((o) => !o.ok)).toEqual([]);
    const admitted = outcomes.flatMap((o) => (o.ok && o.a.ok ? [o.a.run.id] : []));
    expect(admitted).toHaveLength(19);
    const rows = await db.query<{ id: string; project: string }>(
      `SELECT id, project FROM agent_runs WHERE tenant = $1::text ORDER BY seq`,
      [t],
    );
    // seq order is the order of the calls.
    expect(rows.rows.slice(1).map((r) => r.id)).toEqual(admitted);
    const perProject = new Map<string, number>();
    for (const r of rows.rows) perProject.set(r.project, (perProject.get(r.project) ?? 0) + 1);
    for (const n of perProject.values()) expect(n).toBeLessThanOrEqual(12);
  }, 30_000);
});
