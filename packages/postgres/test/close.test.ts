/**
 * Ending a limiter and its pool leaves nothing behind: after `close()` resolves, no statement
 * of the limiter is in flight, no timer is left on its clock and no LISTEN session is open,
 * whether it comes before the tables exist, while the LISTEN session connects, or while a
 * pass hands a slot on. Then the pool ends, and the database is dropped with FORCE, as a
 * benchmark or a test suite does at its end: nothing is left to be terminated, so nothing
 * emits an error that no one hears.
 */
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ConcurrencyLimiterError, ManualClock, type ConcurrencyLease } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import { endPool } from '../../../scripts/postgres-config.js';
import { postgresConfig, until } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

type Limiter = PostgresConcurrencyLimiter<'default'>;

/** Where `close()` comes: each is one of the windows in which something could outlive it. */
const moments = {
  /** Before the tables exist: the schema statements are in flight, the request is starting. */
  async beforeReady(limiter: Limiter) {
    const waiting = limiter.acquire().catch((error: unknown) => error);
    await limiter.close();
    expect(await waiting).toBeInstanceOf(ConcurrencyLimiterError);
  },
  /** Right after the first grant: the LISTEN session is still connecting, a request is being queued. */
  async whileListenConnects(limiter: Limiter) {
    await limiter.acquire();
    const waiting = limiter.acquire().catch((error: unknown) => error);
    await limiter.close();
    expect(await waiting).toBeInstanceOf(ConcurrencyLimiterError);
  },
  /** Listening, one request queued, and the slot being handed to it by a release in flight. */
  async whileHandingOn(limiter: Limiter) {
    const held = await limiter.acquire();
    await until(() => limiter.wakeups === 'notify', 'the LISTEN session is trusted');
    const waiting: Promise<ConcurrencyLease<'default'> | 'failed'> = limiter
      .acquire()
      .catch(() => 'failed' as const);
    await until(async () => (await limiter.stats()).queued === 1, 'the request is queued');
    const released = limiter.release(held);
    await limiter.close();
    await released;
    // Either the hand-on won or close did; neither leaves the request hanging.
    const outcome = await waiting;
    expect(outcome === 'failed' || outcome.workload === 'default').toBe(true);
  },
};

describeWith({ PostgreSQL: postgresConfig })(
  'closing the PostgreSQL limiter, then its pool, then dropping the database',
  () => {
    let admin: pg.Client;
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => void uncaught.push(error);

    beforeAll(async () => {
      admin = new pg.Client({ ...postgresConfig });
      await admin.connect();
      process.on('uncaughtException', onUncaught);
      process.on('unhandledRejection', onUncaught);
    });
    afterAll(async () => {
      process.off('uncaughtException', onUncaught);
      process.off('unhandledRejection', onUncaught);
      await admin?.end();
    });

    const sessionsOn = async (database: string) =>
      (
        await admin.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
          [database],
        )
      ).rows[0]!.n;

    it('50 rounds of create, use, close, end and DROP DATABASE WITH (FORCE) leave no session, timer or error', async () => {
      const kinds = Object.keys(moments) as (keyof typeof moments)[];
      for (let round = 0; round < 50; round++) {
        const kind = kinds[round % kinds.length]!;
        const database = `sluice_close_${process.pid}_${round}`;
        await admin.query(`CREATE DATABASE ${database}`);
        const pool = new pg.Pool({ ...postgresConfig, database, max: 4 });
        const poolErrors: unknown[] = [];
        pool.on('error', (error) => poolErrors.push(error));
        const clock = new ManualClock();
        const limiter = createPostgresConcurrencyLimiter({
          db: pool,
          name: 'closing',
          maxConcurrent: 1,
          clock,
        });

        await moments[kind](limiter);

        const where = `round ${round} (${kind})`;
        expect(clock.pendingTimers, `${where}: timers on the limiter's clock`).toBe(0);
        expect(pool.totalCount - pool.idleCount, `${where}: connections checked out`).toBe(0);
        // The pool's own connections, idle; the LISTEN session would be one more.
        expect(await sessionsOn(database), `${where}: sessions on the database`).toBe(pool.totalCount);

        await endPool(pool);
        expect(await sessionsOn(database), `${where}: sessions after the pool ended`).toBe(0);
        await admin.query(`DROP DATABASE ${database} WITH (FORCE)`);
        // An 'error' event or a rejection nobody handles surfaces on a later turn of the loop.
        await new Promise((resolve) => setTimeout(resolve, 10));
        expect(poolErrors, `${where}: pool errors`).toEqual([]);
        expect(uncaught, `${where}: uncaught errors`).toEqual([]);
      }
      // A round takes about half a second, most of it creating and dropping the database;
      // longer on a busy machine.
    }, 240_000);
  },
);
