/**
 * One worker process of bench/postgres-limiter: LOOPS requests, each taking a slot, holding
 * it HOLD_MS, giving it back and asking again at once, so the queue never empties. Prints
 * what it measured inside the window [START_AT + WARM_MS, + DURATION_MS] as one JSON line.
 */
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { toDatabase, type Database } from '@sluice/postgres/database';
import type { ConcurrencyLease } from 'sluice/concurrency';
import { SpecPollingLimiter } from './spec-polling-limiter.js';

const env = process.env;
const design = env.DESIGN as 'spec' | 'ours';
const holdMs = Number(env.HOLD_MS);
const loops = Number(env.LOOPS);
const startAt = Number(env.START_AT);
const windowStart = startAt + Number(env.WARM_MS);
const windowEnd = windowStart + Number(env.DURATION_MS);
const limits = JSON.parse(env.LIMITS!);
const now = () => performance.timeOrigin + performance.now(); // wall clock, sub-millisecond, same on every process

const pool = new pg.Pool({ ...JSON.parse(env.PG!), max: design === 'spec' ? 20 : 10 });
pool.on('error', (error) => console.error(`worker pool: ${error.message}`));
let statements = 0;
const raw = toDatabase(pool);
// Counts every statement sent, BEGIN and COMMIT included.
const db: Database = {
  query: (text, params) => (statements++, raw.query(text, params)),
  transaction: (body, options) =>
    raw.transaction((tx) => {
      statements += 2;
      return body({ query: (text, params) => (statements++, tx.query(text, params)) });
    }, options),
  listen: raw.listen,
};

const ours =
  design === 'ours'
    ? createPostgresConcurrencyLimiter<'interactive' | 'background'>({
        ...limits,
        db,
        schema: 'bench',
        name: 'bench',
        listen: env.LISTEN !== 'off',
        synchronousCommit: env.SYNC !== 'off',
      })
    : undefined;
const spec =
  design === 'spec'
    ? new SpecPollingLimiter(db, 'bench', 'bench', {
        pollIntervalMs: 100,
        leaseTtlMs: limits.leaseTtlMs,
        queueEntryTtlMs: 15_000,
        maxConcurrent: limits.maxConcurrent,
        synchronousCommit: env.SYNC !== 'off',
      })
    : undefined;
await ours?.ready();

const releases: number[] = [];
const grants: number[] = [];
let heldMs = 0;
let statementsAtStart = 0;
let statementsAtEnd = 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function loop(i: number): Promise<void> {
  const workload = i % 5 === 0 ? 'interactive' : 'background';
  while (now() < windowEnd) {
    const asked = now();
    const lease: ConcurrencyLease = ours
      ? await ours.acquire({ workload: workload as 'interactive' | 'background' })
      : await spec!.acquire(workload);
    const got = now();
    await sleep(holdMs);
    const released = now();
    // Slot use counts the part of each hold inside the window.
    heldMs += Math.max(0, Math.min(released, windowEnd) - Math.max(got, windowStart));
    if (got >= windowStart && got < windowEnd && got - asked > 1) grants.push(got);
    if (released >= windowStart && released < windowEnd) releases.push(released);
    if (ours) await ours.release(lease);
    else await spec!.release(lease);
  }
}

await sleep(Math.max(0, startAt - Date.now()));
setTimeout(() => (statementsAtStart = statements), Math.max(0, windowStart - Date.now()));
setTimeout(() => (statementsAtEnd = statements), Math.max(0, windowEnd - Date.now()));
await Promise.all(Array.from({ length: loops }, (_, i) => loop(i)));
await ours?.close();
await pool.end();
console.log(
  JSON.stringify({
    releases,
    grants,
    heldMs,
    statements: statementsAtEnd - statementsAtStart,
    metrics: ours?.metrics,
  }),
);
