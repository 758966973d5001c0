import type pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema } from './helpers.js';
import { spawnWorker } from './workers/spawn.js';
import { describeWith } from '../../../scripts/service-suites.js';

async function until(check: () => Promise<boolean> | boolean, what: string, tries = 400): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await check()) return;
    await sleep(25);
  }
  throw new Error(`timed out waiting until ${what}`);
}

describeWith({ PostgreSQL: postgresConfig })('PostgreSQL limiter: crashes', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('crash');
  const opened: PostgresConcurrencyLimiter<string>[] = [];
  const open = (name: string, options: Record<string, unknown>, db: pg.Pool = pool) => {
    const limiter = createPostgresConcurrencyLimiter({ maxConcurrent: 1, ...options, db, schema, name });
    opened.push(limiter);
    return limiter;
  };
  const workerEnv = (name: string, limits: object, mode: string) => ({
    PG: JSON.stringify(postgresConfig),
    SCHEMA: schema,
    LIMITER: name,
    MODE: mode,
    LIMITS: JSON.stringify(limits),
  });
  beforeAll(() => {
    pool = createPool(10);
  });
  afterAll(async () => {
    for (const l of opened) await l.close();
    await pool.end();
  });

  it('kill -9 of a slot holder: the slot comes back when its lease lapses, not before', async () => {
    const limits = { maxConcurrent: 1, leaseTtlMs: 1500 };
    const holder = spawnWorker('./limiter-worker.ts', workerEnv('holder', limits, 'hold'));
    const dead = JSON.parse(await holder.line((l) => l.startsWith('{')));
    holder.kill('SIGKILL');
    const limiter = open('holder', limits);
    const lease = await limiter.acquire({ timeoutMs: 20_000 });
    // Database time on both sides: never before the dead lease's expiry, and soon after it.
    expect(lease.acquiredAt).toBeGreaterThanOrEqual(dead.expiresAt);
    expect(lease.acquiredAt - dead.expiresAt).toBeLessThan(limits.leaseTtlMs);
    expect(lease.fence).toBeGreaterThan(dead.fence);
    await limiter.release(lease);
  }, 30_000);

  it('kill -9 of a waiter: its queue entry and its offer lapse, and the next waiter proceeds', async () => {
    const limits = { maxConcurrent: 1, leaseTtlMs: 10_000, queueEntryTtlMs: 1500, offerTtlMs: 1000 };
    const limiter = open('waiter', limits);
    const held = await limiter.acquire();
    const waiter = spawnWorker('./limiter-worker.ts', workerEnv('waiter', limits, 'wait'));
    await waiter.line((l) => l === 'waiting');
    await until(async () => (await limiter.stats()).queued === 1, 'the worker is queued');
    const mine = limiter.acquire({ timeoutMs: 20_000 });
    await until(async () => (await limiter.stats()).queued === 2, 'this process is queued behind it');
    waiter.kill('SIGKILL');
    // The freed slot goes first to the dead process's request, as an offer it never claims.
    await limiter.release(held);
    const lease = await mine;
    expect(lease.workload).toBe('default');
    const left = await pool.query(
      `SELECT count(*)::int AS n FROM ${schema}.concurrency_waiters WHERE limiter = 'waiter'`,
    );
    expect(left.rows[0].n).toBe(0);
    await limiter.release(lease);
    expect(await limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  }, 30_000);

  it('killing the LISTEN connection: hand-offs go on by polling, and wake-ups come back', async () => {
    const other = createPool(4); // a second pool: a second "process" with its own LISTEN session
    try {
      const a = open('listen', {});
      const b = open('listen', {}, other);
      const handOff = async () => {
        const held = await a.acquire({ timeoutMs: 20_000 });
        const waiting = b.acquire({ timeoutMs: 20_000 });
        await until(async () => (await a.stats()).queued === 1, 'b is queued');
        await a.release(held);
        await b.release(await waiting);
      };
      await handOff();
      await until(() => b.wakeups === 'notify', 'b listens');
      const killed = await pool.query(
        `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN "sluice_limiter_%'`,
      );
      expect(killed.rows.length).toBeGreaterThanOrEqual(1);
      await until(() => b.wakeups === 'polling', 'b notices the lost session');
      await handOff();
      await until(() => b.wakeups === 'notify', 'b listens again');
      const listeners = await pool.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN "sluice_limiter_%'`,
      );
      expect(listeners.rows[0].n).toBeGreaterThanOrEqual(1);
      await handOff();
    } finally {
      await other.end();
    }
  }, 60_000);

  it('with LISTEN turned off, polling alone hands slots on', async () => {
    const other = createPool(4);
    try {
      const a = open('polling', { listen: false, pollIntervalMs: 50 });
      const b = open('polling', { listen: false, pollIntervalMs: 50 }, other);
      for (let i = 0; i < 5; i++) {
        const held = await a.acquire({ timeoutMs: 20_000 });
        const waiting = b.acquire({ timeoutMs: 20_000 });
        await until(async () => (await a.stats()).queued === 1, 'b is queued');
        await a.release(held);
        await b.release(await waiting);
      }
      expect(b.wakeups).toBe('polling');
    } finally {
      await other.end();
    }
  }, 60_000);
});
