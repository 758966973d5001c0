/**
 * A worker process for the multi-process tests: many concurrent loops of random acquire,
 * cancel, renew and release (and sometimes a lease left to expire) on one shared limiter.
 * Prints one JSON line of counts when done.
 *
 * Env: PG (JSON connection settings), SCHEMA, LIMITER, DURATION_MS, LOOPS.
 */
import pg from 'pg';
import { ConcurrencyError } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { sharedLimits } from './shared-limits.js';

const pool = new pg.Pool({ ...JSON.parse(process.env.PG!), max: 8 });
const limiter = createPostgresConcurrencyLimiter({
  ...sharedLimits,
  db: pool,
  schema: process.env.SCHEMA!,
  name: process.env.LIMITER!,
});
const until = Date.now() + Number(process.env.DURATION_MS ?? 5000);
const counts = {
  granted: 0,
  timedOut: 0,
  cancelled: 0,
  queueFull: 0,
  expiredOnPurpose: 0,
  renewed: 0,
  errors: [] as string[],
};
const workloads = ['vip', 'std', 'bulk'] as const;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const rand = (n: number) => Math.floor(Math.random() * n);

async function loop(): Promise<void> {
  while (Date.now() < until) {
    const workload = workloads[rand(3)]!;
    const controller = new AbortController();
    const cancelAfter = rand(4) === 0 ? rand(150) : undefined;
    const timer =
      cancelAfter === undefined
        ? undefined
        : setTimeout(() => controller.abort(new Error('cancel')), cancelAfter);
    try {
      let lease = await limiter.acquire({ workload, signal: controller.signal, timeoutMs: 200 + rand(800) });
      counts.granted++;
      clearTimeout(timer);
      const hold = rand(60);
      if (rand(20) === 0) {
        // Stop renewing and walk away: the lease must lapse on its own.
        counts.expiredOnPurpose++;
        continue;
      }
      await sleep(hold);
      if (rand(3) === 0) {
        const renewed = await limiter.renew(lease);
        if (renewed) {
          lease = renewed;
          counts.renewed++;
        }
      }
      await limiter.release(lease);
    } catch (error) {
      clearTimeout(timer);
      if (error instanceof Error && error.message === 'cancel') counts.cancelled++;
      else if (error instanceof ConcurrencyError && error.name === 'ConcurrencyTimeoutError')
        counts.timedOut++;
      else if (error instanceof ConcurrencyError && error.name === 'ConcurrencyQueueFullError')
        counts.queueFull++;
      else counts.errors.push(String(error));
    }
    await sleep(rand(10));
  }
}

await Promise.all(Array.from({ length: Number(process.env.LOOPS ?? 10) }, loop));
await limiter.close();
await pool.end();
console.log(JSON.stringify(counts));
