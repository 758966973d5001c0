import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema } from './helpers.js';
import { sharedLimits } from './workers/shared-limits.js';
import { spawnWorker } from './workers/spawn.js';
import { describeWith } from '../../../scripts/service-suites.js';

interface Snapshot {
  leases: { workload: string; valid: boolean; waiter_seq: number | null }[];
  waiters: { workload: string; seq: number }[];
}

const workloads = Object.entries(sharedLimits.workloads).map(([name, w]) => ({
  name,
  ceiling: 'maxConcurrent' in w ? w.maxConcurrent : sharedLimits.maxConcurrent,
  reserved: 'reserved' in w ? w.reserved : 0,
}));

/** Every rule a snapshot taken between two allocations must satisfy. */
function violations(s: Snapshot): string[] {
  const out: string[] = [];
  const valid = s.leases.filter((l) => l.valid);
  if (valid.length > sharedLimits.maxConcurrent)
    out.push(`${valid.length} valid leases > ${sharedLimits.maxConcurrent}`);
  let occupied = 0;
  for (const w of workloads) {
    const n = valid.filter((l) => l.workload === w.name).length;
    if (n > w.ceiling) out.push(`${w.name}: ${n} valid leases > ceiling ${w.ceiling}`);
    occupied += Math.max(n, w.reserved);
  }
  if (occupied > sharedLimits.maxConcurrent) out.push(`a reservation was lent: occupied ${occupied}`);
  // Counting every lease row (an expired one is not swept until the next allocation), no
  // waiting request may have room: each allocation serves everyone it can.
  const rows = (name: string) => s.leases.filter((l) => l.workload === name).length;
  const shared = sharedLimits.maxConcurrent - workloads.reduce((a, w) => a + w.reserved, 0);
  const sharedUsed = workloads.reduce((a, w) => a + Math.max(0, rows(w.name) - w.reserved), 0);
  for (const waiter of s.waiters) {
    const w = workloads.find((x) => x.name === waiter.workload)!;
    const n = rows(w.name);
    const room =
      s.leases.length < sharedLimits.maxConcurrent &&
      n < w.ceiling &&
      (n < w.reserved || sharedUsed < shared);
    if (room) out.push(`waiter ${waiter.seq} (${w.name}) waits although its workload has room`);
  }
  // First in, first out: no slot of a workload went to a later arrival while an earlier one
  // of the same workload still waits.
  for (const lease of valid) {
    if (lease.waiter_seq === null) continue;
    const earlier = s.waiters.find((w) => w.workload === lease.workload && w.seq < lease.waiter_seq!);
    if (earlier)
      out.push(`${lease.workload}: arrival ${lease.waiter_seq} holds a slot while ${earlier.seq} waits`);
  }
  return out;
}

describeWith({ PostgreSQL: postgresConfig })('PostgreSQL limiter across processes', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('multi');
  beforeAll(() => {
    pool = createPool(4);
  });
  afterAll(() => pool.end());

  it('4 worker processes doing random work never break a rule, checked many times a second', async () => {
    const name = 'shared';
    // Create the tables and store the limits before the workers start.
    const setup = createPostgresConcurrencyLimiter({ ...sharedLimits, db: pool, schema, name });
    await setup.ready();
    await setup.close();

    const env = {
      PG: JSON.stringify(postgresConfig),
      SCHEMA: schema,
      LIMITER: name,
      DURATION_MS: '6000',
      LOOPS: '12',
    };
    const workers = Array.from({ length: 4 }, () => spawnWorker('./random-worker.ts', env));
    const done = Promise.all(workers.map((w) => w.output));
    let finished = false;
    void done.finally(() => (finished = true)).catch(() => undefined);

    const checker = await pool.connect();
    let snapshots = 0;
    let busy = 0;
    const problems: string[] = [];
    try {
      while (!finished) {
        // Between two allocations: the checker takes the limiter's row lock in share mode.
        await checker.query('BEGIN');
        await checker.query(`SELECT 1 FROM ${schema}.concurrency_limiters WHERE name = $1 FOR SHARE`, [name]);
        const leases = (
          await checker.query(
            `SELECT workload, expires_at > clock_timestamp() AS valid, waiter_seq::float8 AS waiter_seq
             FROM ${schema}.concurrency_leases WHERE limiter = $1`,
            [name],
          )
        ).rows;
        const waiters = (
          await checker.query(
            `SELECT workload, seq::float8 AS seq FROM ${schema}.concurrency_waiters
             WHERE limiter = $1 AND (deadline IS NULL OR deadline > clock_timestamp())`,
            [name],
          )
        ).rows;
        await checker.query('COMMIT');
        snapshots++;
        if (waiters.length > 0) busy++;
        for (const p of violations({ leases, waiters })) problems.push(p);
        await new Promise((r) => setTimeout(r, 5));
      }
    } finally {
      checker.release();
    }
    const results = (await done).map((out) => JSON.parse(out.trim().split('\n').at(-1)!));
    expect(problems).toEqual([]);
    expect(snapshots).toBeGreaterThan(100);
    expect(busy).toBeGreaterThan(20); // the queue was really under pressure
    for (const r of results) {
      expect(r.errors).toEqual([]);
      expect(r.granted).toBeGreaterThan(20);
    }
    const total = (k: string) => results.reduce((a, r) => a + r[k], 0);
    expect(total('timedOut') + total('cancelled')).toBeGreaterThan(0);
    expect(total('expiredOnPurpose')).toBeGreaterThan(0);
  }, 60_000);

  it('across processes, a freed slot goes to the higher priority first, then in arrival order', async () => {
    const name = 'priority';
    const limits = { maxConcurrent: 1, workloads: { low: {}, high: { priority: 10 } } };
    const holder = createPostgresConcurrencyLimiter({ ...limits, db: pool, schema, name });
    const held = await holder.acquire({ workload: 'low' });
    const env = (workload: string) => ({
      PG: JSON.stringify(postgresConfig),
      SCHEMA: schema,
      LIMITER: name,
      MODE: 'wait',
      WORKLOAD: workload,
      HOLD_MS: '100',
      LIMITS: JSON.stringify(limits),
    });
    // Arrival order: low-1, low-2, high. Each joins the queue before the next starts.
    const order = ['low-1', 'low-2', 'high'];
    const workers = [];
    for (const [i, label] of order.entries()) {
      const worker = spawnWorker('./limiter-worker.ts', env(label.startsWith('high') ? 'high' : 'low'));
      workers.push(worker);
      await worker.line((l) => l === 'waiting');
      for (let t = 0; (await holder.stats()).queued < i + 1; t++) {
        if (t > 400) throw new Error('worker did not queue');
        await new Promise((r) => setTimeout(r, 25));
      }
    }
    await holder.release(held);
    const grantedAt = await Promise.all(
      workers.map(async (w) => Number((await w.line((l) => l.startsWith('granted'))).split(' ')[1])),
    );
    await Promise.all(workers.map((w) => w.output));
    const served = order.map((label, i) => ({ label, at: grantedAt[i]! })).sort((a, b) => a.at - b.at);
    expect(served.map((s) => s.label)).toEqual(['high', 'low-1', 'low-2']);
    await holder.close();
  }, 60_000);
});
