import type { Database } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { decideByCounts, highestCounts, setOf, Tally } from '../../src/runs/admission-counts.js';
import { hasRoom } from '../../src/runs/caps.js';
import { admitDecided, bornStatus } from '../../src/runs/lifecycle.js';
import { readCounters, type NewRun } from '../../src/runs/store.js';
import { freshDatabase, postgres } from '../helpers.js';
import { limits, openDb, run, who } from '../limits/admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * The cap rule is written in TypeScript (runs/caps.ts) and read by SQL in two places: which set
 * a stored run counts in (`sluice_admission_set`, sql/015), and the bound the fast path checks
 * (`sluice_admit_runs`, sql/016). These hold the SQL to the TypeScript on a real PostgreSQL.
 */

const shapes: [name: string, run: Partial<NewRun>][] = [
  ['default, queued', {}],
  ['default, inline', { mode: 'inline' }],
  ['default, scheduled', { schedule: { delayMs: 60_000 } }],
  ['default, inline with a schedule', { mode: 'inline', schedule: { atMs: 0 } }],
  ['deferred, queued', { class: 'deferred' }],
  ['deferred, scheduled', { class: 'deferred', schedule: { delayMs: 60_000 } }],
];

/** Sets the tenant's counter row ('' project) to `count` in every set. */
async function setCounts(db: Database, tenant: string, count: number) {
  await db.query(
    `INSERT INTO admission_counters (tenant, project, default_active, default_scheduled, deferred_waiting)
     VALUES ($1::text, '', $2::int, $2::int, $2::int), ($1::text, 'p', 0, 0, 0)
     ON CONFLICT (tenant, project) DO UPDATE SET default_active = EXCLUDED.default_active,
       default_scheduled = EXCLUDED.default_scheduled, deferred_waiting = EXCLUDED.deferred_waiting`,
    [tenant, count],
  );
}

describeWith({ PostgreSQL: postgres })('the cap rule in SQL agrees with its TypeScript twin', () => {
  it('every shape of new run counts in the set sluice_admission_set gives the state it is born in', async () => {
    const db = await openDb(await freshDatabase());
    for (const [name, shape] of shapes) {
      const newRun = run(shape);
      const stored = (
        await db.query<{ set: string | null }>('SELECT sluice_admission_set($1::text, $2::text) AS set', [
          newRun.class,
          bornStatus(newRun),
        ])
      ).rows[0]!.set;
      expect(stored, name).toBe(setOf(newRun, limits()).set);
    }
  });

  it('sluice_admit_runs writes a batch exactly when hasRoom says its runs fit, for every count, cap and size', async () => {
    const db = await openDb(await freshDatabase());
    const seen: string[] = [];
    for (const cap of [0, 1, 2, 3]) {
      for (const count of [0, 1, 2, 3, 4]) {
        for (const k of [1, 2, 3]) {
          for (const [name, shape] of shapes.filter(([, s]) => s.mode !== 'inline')) {
            const tenant = `t_${cap}_${count}_${k}_${seen.length}`;
            const capped = limits({ activePerTenant: cap, scheduled: cap, deferredQueued: cap });
            await setCounts(db, tenant, count);
            const batch = Array.from({ length: k }, () => ({
              who: who(tenant),
              run: run(shape),
              limits: capped,
            }));
            const fits = hasRoom(count, cap, k);
            // The TypeScript decision from the same counters admits the whole batch exactly then.
            const decided = decideByCounts(new Tally(await readCounters(db, tenant, ['p'])), batch);
            expect(
              decided.every((refusal) => refusal === undefined),
              `${name} ${cap}/${count}/${k}`,
            ).toBe(fits);
            // And the statement, given the bound for the whole batch, writes it exactly then.
            const rows = await admitDecided(db, tenant, highestCounts(batch, ['', 'p']), batch);
            expect(rows?.length, `${name}: cap ${cap}, count ${count}, ${k} runs`).toBe(fits ? k : undefined);
            seen.push(`${name} ${cap}/${count}/${k}: ${fits}`);
          }
        }
      }
    }
    expect(seen.filter((s) => s.endsWith('true')).length).toBeGreaterThan(20);
    expect(seen.filter((s) => s.endsWith('false')).length).toBeGreaterThan(20);
  });
});
