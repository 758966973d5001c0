import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  ConcurrencyLimiterError,
  ConcurrencyTimeoutError,
  MINUTE,
  ManualClock,
  acquireSlot,
  type ConcurrencyEvent,
  type ConcurrencyLease,
} from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import {
  createPool,
  poolThrough,
  postgresConfig,
  startDatabaseProxy,
  uniqueSchema,
  until,
} from './helpers.js';
import { describeWith, itWith } from '../../../scripts/service-suites.js';

type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };
function settle<T>(promise: Promise<T>): { done: Promise<Settled<T>>; settled: () => boolean } {
  let settled = false;
  const done = promise.then(
    (value) => ((settled = true), { ok: true as const, value }),
    (error: unknown) => ((settled = true), { ok: false as const, error }),
  );
  return { done, settled: () => settled };
}

describe('PostgreSQL limiter fails closed', () => {
  it('rejects with ConcurrencyLimiterError when the database is unreachable', async () => {
    const pool = new pg.Pool({ host: '127.0.0.1', port: 1, connectionTimeoutMillis: 2000 });
    const limiter = createPostgresConcurrencyLimiter({
      db: pool,
      name: 'down',
      maxConcurrent: 1,
      listen: false,
    });
    const events: ConcurrencyEvent[] = [];
    let providerCalled = false;
    const outcome = await acquireSlot({ limiter, runId: 'r1', onEvent: (e) => events.push(e) }).then(
      () => (providerCalled = true),
      (error: unknown) => error,
    );
    expect(providerCalled).toBe(false);
    expect(outcome).toBeInstanceOf(ConcurrencyLimiterError);
    expect(outcome).toMatchObject({ limiter: 'down', workload: 'default', runId: 'r1' });
    expect((outcome as Error).message).toMatch(/Limiter `down` failed: .*ECONNREFUSED/);
    expect(events.map((e) => e.type)).toEqual(['wait-started', 'limiter-error']);
    await limiter.close();
    await pool.end();
  });

  itWith({ PostgreSQL: postgresConfig })(
    'a holder whose database goes away gets renewal-failed, then lease-lost',
    async () => {
      const pool = createPool(2);
      const limiter = createPostgresConcurrencyLimiter({
        db: pool,
        schema: uniqueSchema('closed'),
        name: 'gone',
        maxConcurrent: 1,
        leaseTtlMs: 600,
      });
      const events: ConcurrencyEvent[] = [];
      const slot = await acquireSlot({ limiter, onEvent: (e) => events.push(e) });
      await limiter.close();
      await pool.end(); // from now on every query fails
      await new Promise<void>((resolve) =>
        slot.signal.addEventListener('abort', () => resolve(), { once: true }),
      );
      // Renewal runs every third of the TTL: two failures, and the third try would come too late.
      expect(events.map((e) => e.type)).toEqual([
        'wait-started',
        'acquired',
        'renewal-failed',
        'renewal-failed',
        'lease-lost',
      ]);
      expect(slot.signal.reason).toMatchObject({ name: 'ConcurrencyLeaseLostError', limiter: 'gone' });
      const failed = events.find((e) => e.type === 'renewal-failed');
      expect(failed && 'error' in failed && failed.error).toBeInstanceOf(ConcurrencyLimiterError);
      await slot.release('failed');
    },
  );
});

describeWith({ PostgreSQL: postgresConfig })(
  'PostgreSQL limiter: the database fails while requests wait',
  () => {
    const schema = uniqueSchema('outage');
    let direct: pg.Pool;
    const closing: (() => Promise<void>)[] = [];
    beforeAll(() => {
      direct = createPool(4);
    });
    afterAll(async () => {
      for (const close of closing.reverse()) await close();
      await direct.end();
    });

    /** A limiter whose connections go through a proxy the test can cut, and one slot held elsewhere. */
    const setUp = async (name: string, options: Record<string, unknown> = {}) => {
      const proxy = await startDatabaseProxy();
      const pool = poolThrough(proxy);
      const clock = new ManualClock();
      const limiter = createPostgresConcurrencyLimiter({
        db: pool,
        schema,
        name,
        maxConcurrent: 1,
        listen: false,
        pollIntervalMs: 100,
        clock,
        ...options,
      });
      const holder = createPostgresConcurrencyLimiter({
        db: direct,
        schema,
        name,
        maxConcurrent: 1,
        listen: false,
      });
      const held = await holder.acquire();
      closing.push(async () => {
        await holder.release(held).catch(() => undefined);
        await holder.close();
        await limiter.close();
        await pool.end();
        await proxy.close();
      });
      const queued = async (n: number) => (await holder.stats()).queued === n;
      return { proxy, clock, limiter, holder, held, queued };
    };

    const failedPolls = (limiter: PostgresConcurrencyLimiter<string>, n: number) =>
      until(() => limiter.metrics.failedPasses >= n, `${n} failed passes`);
    // A pass is counted once its commit is answered; what follows it (arming the poll) is
    // synchronous, so once the count shows, the request is settled in its queue.
    const passes = (limiter: PostgresConcurrencyLimiter<string>, n: number) =>
      until(() => limiter.metrics.passes === n, `${n} passes`);

    it('a database that stays away fails every waiting request after outageGraceMs, long before its deadline', async () => {
      const { proxy, clock, limiter, queued } = await setUp('stays-away', { outageGraceMs: 1000 });
      const waiting = settle(limiter.acquire({ timeoutMs: 10 * MINUTE, runId: 'run-1' }));
      await passes(limiter, 1);
      const forever = settle(limiter.acquire({ runId: 'run-2' })); // no deadline at all
      await passes(limiter, 2);
      expect(await queued(2)).toBe(true);
      await proxy.cut();
      clock.advance(100); // the poll finds the database gone
      await failedPolls(limiter, 1);
      clock.advance(999);
      await failedPolls(limiter, 2); // the quick retry fails too
      expect(waiting.settled() || forever.settled()).toBe(false);
      clock.advance(1); // 1000 ms since the first unanswered pass
      for (const [outcome, runId] of [
        [await waiting.done, 'run-1'],
        [await forever.done, 'run-2'],
      ] as const) {
        expect(outcome.ok).toBe(false);
        const error = (outcome as { error: unknown }).error;
        expect(error).toBeInstanceOf(ConcurrencyLimiterError);
        expect(error).toMatchObject({ limiter: 'stays-away', workload: 'default', runId });
        expect((error as Error).message).toMatch(/^Limiter `stays-away` failed: /);
      }
    });

    it('a deadline that comes while the database fails ends the request then, with ConcurrencyLimiterError', async () => {
      const { proxy, clock, limiter, queued } = await setUp('deadline', { outageGraceMs: 10 * MINUTE });
      const waiting = settle(limiter.acquire({ timeoutMs: 500 }));
      await passes(limiter, 1);
      expect(await queued(1)).toBe(true);
      await proxy.cut();
      clock.advance(100);
      await failedPolls(limiter, 1);
      clock.advance(399);
      expect(waiting.settled()).toBe(false);
      clock.advance(1); // the deadline
      const outcome = await waiting.done;
      expect(outcome.ok).toBe(false);
      const error = (outcome as { error: unknown }).error;
      expect(error).toBeInstanceOf(ConcurrencyLimiterError);
      expect(error).not.toBeInstanceOf(ConcurrencyTimeoutError);
    });

    it('a short blip is ridden out: the request keeps its place and gets the slot', async () => {
      const { proxy, clock, limiter, holder, held, queued } = await setUp('blip', {
        outageGraceMs: 10 * MINUTE,
      });
      const waiting = settle(limiter.acquire({ timeoutMs: 10 * MINUTE }));
      await passes(limiter, 1);
      expect(await queued(1)).toBe(true);
      await proxy.cut();
      clock.advance(100);
      await failedPolls(limiter, 1);
      await proxy.restore();
      const before = limiter.metrics.passes;
      clock.advance(100); // the quick retry gets through
      await until(() => limiter.metrics.passes > before, 'a poll gets through');
      expect(waiting.settled()).toBe(false);
      await holder.release(held);
      // The slot is offered to the waiter; a poll of its own claims it.
      await until(() => {
        if (!waiting.settled()) clock.advance(100);
        return waiting.settled();
      }, 'the waiter is served');
      const outcome = await waiting.done;
      expect(outcome.ok).toBe(true);
      const lease = (outcome as { value: ConcurrencyLease<string> }).value;
      expect(lease.limiter).toBe('blip');
      await limiter.release(lease);
    });

    it('connections terminated by the server (pg_terminate_backend) while a request waits: it is still served', async () => {
      const pool = createPool(4, { application_name: 'sluice-terminated' });
      const errors: unknown[] = [];
      pool.on('error', (error) => errors.push(error));
      const name = 'terminated';
      const limiter = createPostgresConcurrencyLimiter({
        db: pool,
        schema,
        name,
        maxConcurrent: 1,
        pollIntervalMs: 50,
        // This test is about surviving terminated connections, not about the grace: on a loaded
        // machine reconnecting can take seconds, so the grace is as long as the request's wait.
        outageGraceMs: 20_000,
      });
      const holder = createPostgresConcurrencyLimiter({ db: direct, schema, name, maxConcurrent: 1 });
      try {
        const held = await holder.acquire();
        const waiting = limiter.acquire({ timeoutMs: 20_000 });
        waiting.catch(() => undefined);
        await until(async () => (await holder.stats()).queued === 1, 'the request is queued');
        await pool.query('SELECT 1'); // a connection of the limiter's pool is surely open
        const killed = await direct.query(
          `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
         WHERE application_name = 'sluice-terminated' AND query NOT LIKE 'LISTEN%'`,
        );
        expect(killed.rows.length).toBeGreaterThan(0);
        // The pool reports a terminated connection only when it was idle at that moment; one busy
        // with a poll fails that query instead. Either way the request must still be served.
        await holder.release(held);
        const lease = await waiting;
        expect(lease.limiter).toBe(name);
        await limiter.release(lease);
      } finally {
        await limiter.close();
        await holder.close();
        await pool.end();
      }
    });
  },
);
