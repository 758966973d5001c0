import pg from 'pg';
import type { Database } from '@sluice/postgres/database';
import { ManualClock } from 'sluice/concurrency';
import { expect, it } from 'vitest';
import { admitRun, type Admission } from '../../src/runs/admission.js';
import { cancelNotStarted, finishRun } from '../../src/runs/lifecycle.js';
import { newRunId } from '../../src/runs/store.js';
import { afterThisTest, freshDatabase, postgres, until } from '../helpers.js';
import { limits, who, run, openDb } from './admission-fixtures.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/*
 * A held run (streamed or inline) whose counts the process expects to fit is admitted by one
 * statement sent on its own (sluice_admit_held, sql/019): one round trip before its provider
 * request. The statement checks the counts under the tenant's lock, so the caps stay exact when
 * another process admitted meanwhile; when a count rose, nothing is written and the batch is
 * decided from a read as before.
 */

const held = (over: Parameters<typeof run>[0] = {}) => run({ id: newRunId(), mode: 'inline', ...over });

/** Counts what `db` sends: each statement, and a transaction as its BEGIN and COMMIT. */
function counting(db: Database): { db: Database; sent: () => number } {
  let sent = 0;
  const counted: Database = Object.create(db) as Database;
  counted.query = ((...args: Parameters<Database['query']>) => {
    sent++;
    return db.query(...args);
  }) as Database['query'];
  counted.transaction = ((body, options) =>
    db.transaction((tx) => {
      sent += 2;
      return body({
        query: ((...args: Parameters<Database['query']>) => {
          sent++;
          return tx.query(...args);
        }) as Database['query'],
      } as typeof tx);
    }, options)) as Database['transaction'];
  return { db: counted, sent: () => sent };
}

type Settled = { ok: true; admission: Admission } | { ok: false; error: unknown };
const settle = (p: Promise<Admission>): Promise<Settled> =>
  p.then(
    (admission) => ({ ok: true as const, admission }),
    (error: unknown) => ({ ok: false as const, error }),
  );

async function activeRuns(db: Database, tenant: string): Promise<number> {
  return (
    await db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1::text AND class = 'default' AND status IN ('queued', 'running')`,
      [tenant],
    )
  ).rows[0]!.n;
}

describeWith({ PostgreSQL: postgres })('held runs admitted in one round trip', () => {
  it('a held or queued run whose counts fit takes one statement, with no read before it', async () => {
    const url = await freshDatabase();
    const { db, sent } = counting(await openDb(url));
    const cap = limits({ activePerTenant: 5 });
    // Time stands still, so the read beside held admissions (once a second) is sent only when told.
    const clock = new ManualClock();
    const admit = (r: ReturnType<typeof run>) => admitRun(db, who('one'), r, cap, 15_000, clock);
    // The line's first batch reconciles under the lock (and reads the counts it then expects).
    expect((await admit(held())).ok).toBe(true);

    let before = sent();
    const admitted = await admit(held());
    expect(admitted.ok && admitted.run.status).toBe('running');
    expect(sent() - before).toBe(1);

    // A second later the statement is followed by a read for the Retry-After history, not preceded.
    clock.advance(1_000);
    before = sent();
    expect((await admit(held())).ok).toBe(true);
    expect(sent() - before).toBe(2);

    before = sent();
    expect((await admit(run())).ok).toBe(true);
    // A queued run: the same one statement, no BEGIN or COMMIT (a lost answer is settled before
    // the caller hears anything: admission-connection-lost.test.ts).
    expect(sent() - before).toBe(1);
  }, 30_000);

  it('a count risen since the expected read (another process admitted) is refused exactly: nothing written past the cap', async () => {
    const url = await freshDatabase();
    const [a, b] = [await openDb(url), await openDb(url)];
    const t = 'rose';
    const cap = limits({ activePerTenant: 2 });
    // Each process reads the counts once: both expect room for one more.
    const first = await admitRun(a, who(t), held(), cap);
    expect(first.ok).toBe(true);
    expect((await admitRun(b, who(t), held(), cap)).ok).toBe(true);
    // a expected 1 active and now finds 2: its statement writes nothing, and the read refuses it.
    const refused = await admitRun(a, who(t), held(), cap);
    expect(refused.ok).toBe(false);
    expect(!refused.ok && refused.refusal).toMatchObject({ kind: 'concurrency', limitValue: 2, active: 2 });
    expect(await activeRuns(a, t)).toBe(2);
    // A place freed: a's next held run is admitted again (the read reset what it expects).
    if (first.ok) await finishRun(a, first.run.id, 'w1', { status: 'succeeded', output: 'ok' });
    expect((await admitRun(a, who(t), held(), cap)).ok).toBe(true);
    expect(await activeRuns(a, t)).toBe(2);
  }, 30_000);

  it('queued runs too: a count risen since the expected read is refused exactly, and a place freed is taken again', async () => {
    const url = await freshDatabase();
    const [a, b] = [await openDb(url), await openDb(url)];
    const t = 'rose-queued';
    const cap = limits({ activePerTenant: 2 });
    const first = await admitRun(a, who(t), run(), cap);
    expect(first.ok).toBe(true);
    expect((await admitRun(b, who(t), run(), cap)).ok).toBe(true);
    // a expects 1 of 2 and finds 2: its statement writes nothing, and the read refuses it.
    const refused = await admitRun(a, who(t), run(), cap);
    expect(!refused.ok && refused.refusal).toMatchObject({ kind: 'concurrency', limitValue: 2, active: 2 });
    expect(await activeRuns(a, t)).toBe(2);
    if (first.ok) await cancelNotStarted(a, t, first.run.id);
    expect((await admitRun(a, who(t), run(), cap)).ok).toBe(true);
    expect(await activeRuns(a, t)).toBe(2);
  }, 30_000);

  it('two processes whose held batches wait at the lock at once never pass the cap', async () => {
    const url = await freshDatabase();
    const [a, b] = [await openDb(url), await openDb(url)];
    const t = 'race';
    const cap = limits({ activePerTenant: 4 });
    for (const db of [a, b]) expect((await admitRun(db, who(t), held(), cap)).ok).toBe(true);
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    afterThisTest(() => holder.end());
    await holder.query('SELECT pg_advisory_lock(hashtext($1::text))', [`sluice:tenant:${t}`]);
    // Each process expects 2 of 4: each batch of two fits what it expects, together they do not.
    const calls = [a, a, b, b].map((db) => settle(admitRun(db, who(t), held(), cap)));
    await until(
      async () =>
        (
          await holder.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          )
        ).rows[0]!.n >= 2,
      'both batches waiting for the admission lock',
    );
    await holder.query('SELECT pg_advisory_unlock(hashtext($1::text))', [`sluice:tenant:${t}`]);
    const outcomes = await Promise.all(calls);
    expect(outcomes.every((o) => o.ok)).toBe(true);
    expect(outcomes.filter((o) => o.ok && o.admission.ok)).toHaveLength(2);
    expect(await activeRuns(a, t)).toBe(4);
  }, 30_000);

  it('under default_transaction_isolation = repeatable read the statement writes nothing and the read path admits', async () => {
    const url = await freshDatabase();
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    afterThisTest(() => admin.end());
    await admin.query(
      `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read'); END $$`,
    );
    const { db, sent } = counting(await openDb(url));
    const cap = limits({ activePerTenant: 2 });
    expect((await admitRun(db, who('rr'), held(), cap)).ok).toBe(true);
    const before = sent();
    expect((await admitRun(db, who('rr'), held(), cap)).ok).toBe(true);
    // The statement, a plain read, the statement again (decided from the read: nothing written
    // either), then the locked transaction: BEGIN, the lock, the locked read, the insert, the
    // batch's lock (held to the COMMIT, for a settling to wait on), COMMIT.
    expect(sent() - before).toBe(9);
    expect((await admitRun(db, who('rr'), held(), cap)).ok).toBe(false);
    expect(await activeRuns(db, 'rr')).toBe(2);
  }, 30_000);
});
