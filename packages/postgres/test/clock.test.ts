import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ConcurrencyTimeoutError, MINUTE, ManualClock } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema, until } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgresConfig })('PostgreSQL limiter: the clock option', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('clock');
  beforeAll(() => {
    pool = createPool(4);
  });
  afterAll(() => pool.end());

  it('waits, polls and stamps on the clock it is given', async () => {
    const clock = new ManualClock();
    const limiter = createPostgresConcurrencyLimiter({
      db: pool,
      schema,
      name: 'manual',
      maxConcurrent: 1,
      listen: false,
      pollIntervalMs: 100,
      outageGraceMs: 10 * MINUTE,
      clock,
    });
    try {
      const holder = await limiter.acquire();
      let settled = false;
      const waiting = limiter.acquire({ timeoutMs: MINUTE, runId: 'run-1' }).finally(() => (settled = true));
      waiting.catch(() => undefined);
      // Its pass is counted once the commit is answered, and the poll is armed right after.
      await until(() => limiter.metrics.passes === 2, 'the request is queued');
      expect((await limiter.stats()).queued).toBe(1);
      // Polls come from the clock: none until it moves.
      expect(limiter.metrics.polls).toBe(0);
      expect(clock.pendingTimers).toBe(2); // the deadline and the poll
      clock.advance(100);
      await until(() => limiter.metrics.polls === 1, 'the first poll');
      clock.advance(MINUTE - 101);
      await limiter.stats(); // a round trip, for anything pending to show
      expect(settled).toBe(false);
      clock.advance(1); // the deadline, to the millisecond
      const error = await waiting.catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
      expect(error).toMatchObject({ limiter: 'manual', runId: 'run-1', waitMs: MINUTE, timeoutMs: MINUTE });
      expect((await limiter.stats()).queued).toBe(0);
      await limiter.release(holder);
    } finally {
      await limiter.close();
    }
  });
});
