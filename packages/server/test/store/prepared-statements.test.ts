import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { fromPgPool, prepared, type Database } from '@sluice/postgres/database';
import { expect, inject, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { admitRun, type Admission } from '../../src/runs/admission.js';
import { claimDeferredRun } from '../../src/runs/claims.js';
import { finishRun } from '../../src/runs/lifecycle.js';
import { newRunId } from '../../src/runs/store.js';
import { openStore } from '../../src/store/store.js';
import { afterThisTest, freshDatabase, postgres, throughPgBouncer } from '../harness/index.js';
import { limits, run, who } from '../limits/admission-fixtures.js';

// The hot statements (a deferred claim, a run's end, admission) are prepared once per
// connection on a direct PostgreSQL connection: bench:queues' claim spent 2 to 3 ms of
// PostgreSQL's CPU planning, every time, on a 2-core machine the server shares with it.

const pgbouncer = inject('pgbouncer');

/** A store of one connection, so that its prepared statements can be read on that connection. */
async function oneConnection(databaseUrl: string, preparedStatements?: boolean): Promise<Database> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-prepared-'));
  const store = await openStore({ databaseUrl, dataDir: dir, poolSize: 1, preparedStatements });
  afterThisTest(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return store.db;
}

const preparedOn = async (db: Database) =>
  (
    await db.query<{ statement: string; generic_plans: string; custom_plans: string }>(
      'SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements ORDER BY statement',
    )
  ).rows;

const admitted = (a: Admission) => {
  if (!a.ok) throw new Error(`refused: ${JSON.stringify(a.refusal)}`);
  return a.run.id;
};

/** Admits a deferred run, claims it and ends it, as a queue worker would. */
async function oneDeferredRun(db: Database, tenant: string): Promise<string> {
  const id = admitted(await admitRun(db, who(tenant), run({ class: 'deferred' }), limits()));
  const claimed = await claimDeferredRun(db, 'w1', 4);
  expect(claimed?.id).toBe(id);
  const ended = await finishRun(db, id, 'w1', { status: 'succeeded', output: { n: 1 } });
  expect(ended).toMatchObject({ id, status: 'succeeded', output: { n: 1 } });
  return id;
}

/** Admits an inline run (held: one statement when its counts fit) and ends it. */
async function oneHeldRun(db: Database, tenant: string): Promise<void> {
  const admission = await admitRun(db, who(tenant), run({ id: newRunId(), mode: 'inline' }), limits());
  const id = admitted(admission);
  expect(admission.ok && admission.run.status).toBe('running');
  await finishRun(db, id, 'w1', { status: 'succeeded', output: { n: 1 } });
}

describeWith({ PostgreSQL: postgres })('prepared statements on a direct connection', () => {
  it('prepares the claim once and keeps one plan for it, and names nothing when told not to', async () => {
    const db = await oneConnection(await freshDatabase());
    for (let i = 0; i < 8; i++) await oneDeferredRun(db, 'acme');
    const statements = await preparedOn(db);
    const claim = statements.find((s) => s.statement.startsWith('WITH candidate AS MATERIALIZED'));
    // Eight claims found a run, eight more found none (the loop asks until the queue is empty
    // once per run): one statement, planned for the first few, then kept.
    expect(claim).toBeDefined();
    expect(Number(claim!.generic_plans)).toBeGreaterThan(0);
    expect(Number(claim!.custom_plans)).toBeLessThanOrEqual(5);
    expect(statements.some((s) => s.statement.startsWith('WITH done AS'))).toBe(true);
    // Named by a hash of the text, the same in every process and version: a session a pooler
    // shares never holds another text under that name (numbered in order of first use, two
    // processes gave one name to two statements, and a sweep ran another's UPDATE).
    const names = await db.query<{ name: string; statement: string }>(
      'SELECT name, statement FROM pg_prepared_statements',
    );
    for (const { name, statement } of names.rows)
      expect(name).toBe(`sluice_${createHash('sha256').update(statement).digest('hex').slice(0, 32)}`);

    const unnamed = await oneConnection(await freshDatabase(), false);
    await oneDeferredRun(unnamed, 'acme');
    expect(await preparedOn(unnamed)).toEqual([]);
  });

  // A rolling upgrade: a newer server migrates the shared database while this one runs. Found
  // here, with statements named or not: the admission functions kept the row's old columns
  // (sql/033_admission_rows_after_migrations.sql).
  it.each([true, false])(
    'a migration that adds a column breaks no admission, claim or end (statements prepared: %s)',
    async (preparedStatements) => {
      const databaseUrl = await freshDatabase();
      const db = await oneConnection(databaseUrl, preparedStatements);
      for (let i = 0; i < 7; i++) {
        await oneDeferredRun(db, 'acme');
        await oneHeldRun(db, 'acme');
      }
      const other = new pg.Client({ connectionString: databaseUrl });
      await other.connect();
      afterThisTest(() => other.end());
      await other.query('ALTER TABLE agent_runs ADD COLUMN added_later int');
      await other.query('ALTER TABLE admission_counters ADD COLUMN added_later int');
      for (let i = 0; i < 3; i++) await oneDeferredRun(db, 'acme');
      // A held run (inline) is written by sluice_admit_held, whose INSERT was planned before.
      for (let i = 0; i < 3; i++) await oneHeldRun(db, 'acme');
    },
  );

  it('a migration that changes a column type costs one failed admission, not every one after it', async () => {
    // A prepared statement keeps its result type: after the change it fails on its connection
    // for as long as that connection lives, and under load a pool's connections never go idle.
    const databaseUrl = await freshDatabase();
    const db = await oneConnection(databaseUrl);
    for (let i = 0; i < 7; i++) await oneDeferredRun(db, 'acme');
    const other = new pg.Client({ connectionString: databaseUrl });
    await other.connect();
    afterThisTest(() => other.end());
    await other.query('ALTER TABLE agent_runs ALTER COLUMN agent TYPE varchar(200)');
    const outcomes: string[] = [];
    for (let i = 0; i < 4; i++)
      outcomes.push(
        await oneDeferredRun(db, 'acme').then(
          () => 'ok',
          (error: { code?: string }) => error.code ?? 'error',
        ),
      );
    // The first admission meets the stale statement and its connection is dropped; the next
    // connection prepares afresh.
    expect(outcomes.slice(1)).toEqual(['ok', 'ok', 'ok']);
  });
});

describeWith({ PostgreSQL: postgres, PgBouncer: pgbouncer })(
  'prepared statements turned on behind a pooler in transaction mode',
  () => {
    it('the pool stops naming statements at the first session that lacks one, and loses no statement', async () => {
      const direct = await freshDatabase();
      const behind = throughPgBouncer(pgbouncer!, direct);
      const text = prepared('SELECT $1::int + 1 AS n');

      // The hazard is real here: two clients naming the same statement meet on one server
      // session, and the second is refused.
      const bare = new pg.Pool({ connectionString: behind, max: 2 });
      afterThisTest(() => bare.end());
      const [a, b] = [await bare.connect(), await bare.connect()];
      const named = { name: 'probe_statement', text: 'SELECT $1::int + 1 AS n', values: [1] };
      const refused = await (async () => {
        for (let i = 0; i < 4; i++) {
          await a.query(named);
          await b.query(named);
        }
      })().then(
        () => undefined,
        (error: { code?: string }) => error.code,
      );
      a.release(true);
      b.release(true);
      expect(['26000', '42P05']).toContain(refused);

      // The same through the adapter, told to name statements: every answer comes back.
      const pool = new pg.Pool({ connectionString: behind, max: 4 });
      afterThisTest(() => pool.end());
      const db = fromPgPool(pool, { preparedStatements: true });
      const answers = await Promise.all(
        Array.from({ length: 40 }, (_, i) => db.query<{ n: number }>(text, [i]).then((r) => r.rows[0]!.n)),
      );
      expect(answers).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
      // In transactions too, once it stopped naming.
      const inTx = await Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          db.transaction(async (tx) => (await tx.query<{ n: number }>(text, [i])).rows[0]!.n),
        ),
      );
      expect(inTx).toEqual(Array.from({ length: 8 }, (_, i) => i + 1));
    });
  },
);
