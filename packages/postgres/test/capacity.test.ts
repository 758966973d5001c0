/**
 * Budgets, the pause and the adaptive limit of the PostgreSQL limiter, in one process with two
 * limiter objects on one database (each object is what a process would have): what one reports
 * holds for the other, since both decide every grant from the limiter's row.
 */
import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ConcurrencyEvent } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgresConfig })('PostgreSQL limiter: capacity shared by limiter objects', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('cap');
  const made: PostgresConcurrencyLimiter<string>[] = [];
  beforeAll(() => {
    pool = createPool(8);
  });
  afterAll(async () => {
    for (const limiter of made) await limiter.close();
    await pool.end();
  });
  const pair = (name: string, options: { maxConcurrent: number } & Record<string, unknown>) => {
    const make = () => {
      const limiter = createPostgresConcurrencyLimiter<string>({ ...options, db: pool, schema, name });
      made.push(limiter);
      return limiter;
    };
    return [make(), make()] as const;
  };

  it('the adaptive limit lowered through one object holds for the other, with its event', async () => {
    const [a, b] = pair('adaptive', { maxConcurrent: 4, adaptive: true });
    const events: ConcurrencyEvent[] = [];
    a.subscribe((e) => events.push(e));
    const leases = await Promise.all([1, 2, 3, 4].map(() => a.acquire()));
    expect((await b.stats()).limit).toBe(4);
    for (const lease of leases) await a.release(lease, { provider: { status: 429, retryAfterMs: 1 } });
    // One burst, one decrease: every lease was granted before it.
    expect(events.filter((e) => e.type === 'limit-changed')).toMatchObject([
      { from: 4, to: 3, reason: 'overload' },
    ]);
    expect(events.filter((e) => e.type === 'provider-throttled')).toHaveLength(4);
    expect((await b.stats()).limit).toBe(3);
    const held = await Promise.all([1, 2, 3].map(() => b.acquire({ timeoutMs: 10_000 })));
    await expect(b.acquire({ timeoutMs: 200 })).rejects.toMatchObject({ name: 'ConcurrencyTimeoutError' });
    for (const lease of held) await b.release(lease);
  }, 30_000);

  it('a 429 reported through one object pauses the grants of the other', async () => {
    const [a, b] = pair('paused', { maxConcurrent: 4 });
    await a.release(await a.acquire(), { provider: { status: 429, retryAfterMs: 30_000 } });
    await expect(b.acquire({ timeoutMs: 300 })).rejects.toMatchObject({ name: 'ConcurrencyTimeoutError' });
    expect(await b.stats()).toMatchObject({ active: 0, queued: 0 });
  }, 30_000);

  it('usage settled through one object is what the other sees in the budget', async () => {
    // 600 a minute: 10 a second, so a few seconds of a busy machine refill little.
    const [a, b] = pair('settled', { maxConcurrent: 4, rate: { tokensPerMinute: 600 } });
    const lease = await a.acquire({ tokens: { input: 300, output: 100 } });
    expect((await b.stats()).budgets?.tokens?.available).toBeLessThan(300);
    await a.release(lease, { usage: { input: 20, output: 5 } });
    const available = (await b.stats()).budgets!.tokens!.available;
    // 600 - 25, plus the refill since, never past the figure.
    expect(available).toBeGreaterThanOrEqual(575);
    expect(available).toBeLessThanOrEqual(600);
    await expect(b.acquire({ tokens: { input: 601 } })).rejects.toMatchObject({
      name: 'ConcurrencyConfigError',
      field: 'tokens',
    });
  }, 30_000);

  it('budgets learned from the headers through one object hold for the other', async () => {
    const [a, b] = pair('learned', { maxConcurrent: 4, adaptive: true });
    await a.release(await a.acquire(), {
      provider: {
        status: 200,
        // 6,000 a minute is 100 a second: a few seconds of a busy machine refill little.
        limits: { tokens: { limit: 6_000, remaining: 1_000, resetMs: 50_000 }, requests: { limit: 600 } },
      },
    });
    const budgets = (await b.stats()).budgets!;
    expect(budgets.tokens?.capacity).toBe(6_000);
    expect(budgets.tokens!.available).toBeLessThan(1_500);
    expect(budgets.requests?.capacity).toBe(600);
    // Larger than what is left: it waits (40 s of refill), it is not refused as too large.
    await expect(b.acquire({ tokens: { input: 5_000 }, timeoutMs: 300 })).rejects.toMatchObject({
      name: 'ConcurrencyTimeoutError',
    });
    const lease = await b.acquire({ tokens: { input: 500 }, timeoutMs: 5_000 });
    // A lower figure stated through b is what a sees.
    await b.release(lease, { provider: { status: 200, limits: { tokens: { limit: 3_000 } } } });
    expect((await a.stats()).budgets?.tokens?.capacity).toBe(3_000);
  }, 30_000);

  it('a damaged capacity row is read as a fresh one, never wedging the limiter', async () => {
    const [a] = pair('damaged', { maxConcurrent: 2, rate: { requestsPerMinute: 10 }, adaptive: true });
    await a.release(await a.acquire());
    for (const garbage of ['"nonsense"', '{"buckets": {"requests": {"level": "x"}}, "limit": -5}', '[]']) {
      await pool.query(`UPDATE ${schema}.concurrency_limiters SET capacity = $2::jsonb WHERE name = $1`, [
        'damaged',
        garbage,
      ]);
      const stats = await a.stats();
      expect(stats.limit).toBe(2);
      expect(stats.budgets?.requests).toEqual({ available: 10, capacity: 10 });
      await a.release(await a.acquire({ timeoutMs: 5_000 }));
    }
  }, 30_000);

  it('a worker with other budgets is refused, naming them', async () => {
    const [a] = pair('budgets-differ', { maxConcurrent: 2, rate: { tokensPerMinute: 1_000 } });
    await a.ready();
    const other = createPostgresConcurrencyLimiter({
      maxConcurrent: 2,
      rate: { tokensPerMinute: 2_000 },
      db: pool,
      schema,
      name: 'budgets-differ',
    });
    made.push(other);
    await expect(other.ready()).rejects.toThrow('rate {"tokens":2000} here, {"tokens":1000} stored');
  }, 30_000);

  it('a worker with the same two budgets joins the row that stored them (jsonb reorders their keys)', async () => {
    const rate = { requestsPerMinute: 600, tokensPerMinute: 60_000 };
    const [a] = pair('two-budgets', { maxConcurrent: 2, rate });
    await a.ready();
    const again = createPostgresConcurrencyLimiter({
      maxConcurrent: 2,
      rate,
      db: pool,
      schema,
      name: 'two-budgets',
    });
    made.push(again);
    await again.ready();
    expect((await again.stats()).budgets?.tokens?.capacity).toBe(60_000);
    const other = createPostgresConcurrencyLimiter({
      maxConcurrent: 2,
      rate: { requestsPerMinute: 600, tokensPerMinute: 50_000 },
      db: pool,
      schema,
      name: 'two-budgets',
    });
    made.push(other);
    await expect(other.ready()).rejects.toThrow(
      'rate {"requests":600,"tokens":50000} here, {"requests":600,"tokens":60000} stored',
    );
  }, 30_000);
});
