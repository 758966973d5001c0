import { readFileSync } from 'node:fs';
import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ConcurrencyConfigError, ConcurrencyLimiterError, ConcurrencyTimeoutError } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, postgresConcurrencySchemaSql } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema } from './helpers.js';
import { spawnWorker } from './workers/spawn.js';
import { describeWith } from '../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgresConfig })('PostgreSQL limiter: schema and stored limits', () => {
  let pool: pg.Pool;
  beforeAll(() => {
    pool = createPool(4);
  });
  afterAll(() => pool.end());

  it('16 processes creating the schema on a fresh database at once all succeed', async () => {
    const schema = uniqueSchema('race');
    const env = {
      PG: JSON.stringify(postgresConfig),
      SCHEMA: schema,
      LIMITER: 'race',
      MODE: 'start',
      LIMITS: JSON.stringify({ maxConcurrent: 4 }),
      START_AT: String(Date.now() + 8_000), // time for 16 processes to boot on 2 cores
    };
    const workers = Array.from({ length: 16 }, () => spawnWorker('./limiter-worker.ts', env));
    const outputs = await Promise.all(workers.map((w) => w.output));
    expect(outputs.map((o) => o.trim())).toEqual(Array(16).fill('ok'));
    const tables = await pool.query(
      `SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = $1`,
      [schema],
    );
    expect(tables.rows[0].n).toBe(5); // limiters, leases, waiters, fair keys, schema version
  }, 120_000);

  it('refuses a worker whose limits differ from the stored ones, naming the differences', async () => {
    const schema = uniqueSchema('limits');
    const first = createPostgresConcurrencyLimiter({ db: pool, schema, name: 'claude', maxConcurrent: 8 });
    await first.ready();
    const other = createPostgresConcurrencyLimiter({
      db: pool,
      schema,
      name: 'claude',
      maxConcurrent: 6,
      workloads: { default: { reserved: 1 } },
    });
    const error = await other.acquire().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    expect((error as Error).message).toContain('maxConcurrent 6 here, 8 stored');
    expect((error as Error).message).toContain('workloads.default.reserved 1 here, 0 stored');
    // In another process too.
    const worker = spawnWorker('./limiter-worker.ts', {
      PG: JSON.stringify(postgresConfig),
      SCHEMA: schema,
      LIMITER: 'claude',
      MODE: 'start',
      LIMITS: JSON.stringify({ maxConcurrent: 6 }),
    });
    await expect(worker.output).rejects.toThrow(
      /ConcurrencyConfigError: Limiter `claude` is stored with other limits/,
    );
    await first.close();
    await other.close();
  }, 60_000);

  it("onConflict: 'replace' stores the new limits, which then apply to everyone", async () => {
    const schema = uniqueSchema('replace');
    const old = createPostgresConcurrencyLimiter({ db: pool, schema, name: 'claude', maxConcurrent: 1 });
    await old.release(await old.acquire());
    const replacing = createPostgresConcurrencyLimiter({
      db: pool,
      schema,
      name: 'claude',
      maxConcurrent: 2,
      onConflict: 'replace',
    });
    const a = await replacing.acquire();
    const b = await replacing.acquire({ timeoutMs: 5_000 }); // a second slot: the new limit is in force
    const stored = await pool.query(
      `SELECT limits FROM ${schema}.concurrency_limiters WHERE name = 'claude'`,
    );
    expect(stored.rows[0].limits.maxConcurrent).toBe(2);
    // A fresh worker with the old limits is now the one refused.
    const stale = createPostgresConcurrencyLimiter({ db: pool, schema, name: 'claude', maxConcurrent: 1 });
    await expect(stale.ready()).rejects.toBeInstanceOf(ConcurrencyConfigError);
    await replacing.release(a);
    await replacing.release(b);
    for (const l of [old, replacing, stale]) await l.close();
  });

  it('ensureSchema: false runs on tables made by postgresConcurrencySchemaSql() as a migration', async () => {
    const schema = uniqueSchema('migrated');
    const missing = createPostgresConcurrencyLimiter({
      db: pool,
      schema,
      name: 'm',
      maxConcurrent: 1,
      ensureSchema: false,
    });
    const error = await missing.acquire().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyLimiterError);
    expect((error as Error).message).toMatch(/does not exist/);
    await missing.close();

    await pool.query(postgresConcurrencySchemaSql({ schema }));
    const limiter = createPostgresConcurrencyLimiter({
      db: pool,
      schema,
      name: 'm',
      maxConcurrent: 1,
      ensureSchema: false,
    });
    const lease = await limiter.acquire();
    expect(lease.fence).toBeGreaterThan(0);
    await limiter.release(lease);
    await limiter.close();
  });

  it('refuses bad PostgreSQL options at creation, naming the field', () => {
    const make = (extra: Record<string, unknown>) => () =>
      createPostgresConcurrencyLimiter({ db: pool, maxConcurrent: 1, ...extra });
    expect(make({ pollIntervalMs: 0 })).toThrow(
      'Expected `pollIntervalMs` to be a whole number >= 1, got `0`',
    );
    expect(make({ schema: 'bad; drop' })).toThrow('Expected `schema` to be a plain SQL identifier');
    expect(make({ onConflict: 'merge' })).toThrow(
      "Expected `onConflict` to be 'error' or 'replace', got `\"merge\"`",
    );
    expect(make({ queueEntryTtl: 5 })).toThrow('Expected `queueEntryTtl` to be a known option');
    expect(() => createPostgresConcurrencyLimiter({ maxConcurrent: 1 } as never)).toThrow(
      ConcurrencyConfigError,
    );
  });
});

describeWith({ PostgreSQL: postgresConfig })('PostgreSQL limiter: schema versions', () => {
  let pool: pg.Pool;
  beforeAll(() => {
    pool = createPool(8);
  });
  afterAll(() => pool.end());

  const versions = async (schema: string) =>
    (await pool.query(`SELECT version FROM ${schema}.concurrency_schema_version ORDER BY version`)).rows.map(
      (r: { version: number }) => r.version,
    );
  const functions = async (schema: string) =>
    (
      await pool.query(
        `SELECT p.proname AS name FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1 ORDER BY p.proname`,
        [schema],
      )
    ).rows.map((r: { name: string }) => r.name);

  it('upgrades a schema made by the first release, keeping its leases, with several workers starting at once', async () => {
    const schema = uniqueSchema('upgrade');
    // The schema as the first release made it (its SQL file, from git history), and a slot
    // held by one of its workers.
    const v1 = readFileSync(new URL('./fixtures/schema-v1.sql', import.meta.url), 'utf8');
    await pool.query(v1.replaceAll('__SCHEMA__', `"${schema}"`));
    const limits = { maxConcurrent: 1, maxQueued: null, leaseTtlMs: 30_000, defaultWorkload: 'default' };
    const workloads = [{ name: 'default', maxConcurrent: 1, reserved: 0, priority: 0, maxWaitMs: null }];
    await pool.query(`INSERT INTO ${schema}.concurrency_limiters (name, limits) VALUES ('old', $1::jsonb)`, [
      JSON.stringify({ ...limits, workloads }),
    ]);
    await pool.query(
      `INSERT INTO ${schema}.concurrency_leases (limiter, workload, fence, owner, acquired_at, expires_at)
       VALUES ('old', 'default', nextval('${schema}.concurrency_fence'), 'old-worker', clock_timestamp(),
         clock_timestamp() + interval '1 hour')`,
    );
    expect(await functions(schema)).toEqual(['concurrency_grant', 'concurrency_pass']);

    const pools = Array.from({ length: 4 }, () => createPool(2));
    const workers = pools.map((db) =>
      createPostgresConcurrencyLimiter({ db, schema, name: 'old', maxConcurrent: 1, listen: false }),
    );
    await Promise.all(workers.map((w) => w.ready()));
    expect(await versions(schema)).toEqual([1, 2, 3, 4]);
    // The earlier releases' pass functions stay for their workers until they are all replaced.
    expect(await functions(schema)).toEqual([
      'concurrency_grant',
      'concurrency_grant_v4',
      'concurrency_pass',
      'concurrency_pass_v2',
      'concurrency_pass_v3',
      'concurrency_pass_v4',
    ]);
    // The old worker's slot still counts.
    const [first] = workers;
    const error = await first!.acquire({ timeoutMs: 200 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
    await pool.query(`DELETE FROM ${schema}.concurrency_leases WHERE owner = 'old-worker'`);
    await first!.release(await first!.acquire({ timeoutMs: 5_000 }));
    for (const w of workers) await w.close();
    for (const p of pools) await p.end();
  }, 60_000);

  it('postgresConcurrencySchemaSql() records every version and can be applied again', async () => {
    const schema = uniqueSchema('twice');
    await pool.query(postgresConcurrencySchemaSql({ schema }));
    await pool.query(postgresConcurrencySchemaSql({ schema }));
    expect(await versions(schema)).toEqual([1, 2, 3, 4]);
  });
});
