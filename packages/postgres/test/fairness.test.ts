/**
 * Fair queuing by key on PostgreSQL: the starvation bound of allocate.ts with 1,000 requests
 * of one key queued in the database, shown by the ordered grant log (one slot, each grant
 * released before the next), and the key table kept to the keys in play.
 */
import type pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ConcurrencyLease } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema, until } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

type Limiter = PostgresConcurrencyLimiter<'default'>;

/**
 * Holds the slot as `holderKey`, queues `burst` (in order), then one probe request (key
 * `probe`, or none when `null`); releases one slot at a time and returns the keys granted
 * before the probe.
 */
async function grantsBeforeProbe(
  limiter: Limiter,
  options: { holderKey: string | undefined; burst: [string | undefined, number][]; probe: string | null },
): Promise<(string | undefined)[]> {
  const controller = new AbortController();
  const granted: { key: string | undefined; probe: boolean; lease: ConcurrencyLease<'default'> }[] = [];
  const ask = (key: string | undefined, probe = false) =>
    void limiter.acquire({ key, signal: controller.signal }).then(
      (lease) => void granted.push({ key, probe, lease }),
      () => undefined,
    );
  let current = await limiter.acquire({ key: options.holderKey });
  let queued = 0;
  for (const [key, n] of options.burst) for (let i = 0; i < n; i++, queued++) ask(key);
  // Every request of the burst is in the queue (so has its tag) before the probe arrives.
  await until(async () => (await limiter.stats()).queued === queued, `${queued} queued`);
  ask(options.probe ?? undefined, true);
  await until(async () => (await limiter.stats()).queued === queued + 1, 'the probe queued');
  const order: (string | undefined)[] = [];
  for (;;) {
    await limiter.release(current);
    await until(() => granted.length > 0, 'the next grant');
    const next = granted.shift()!;
    current = next.lease;
    if (next.probe) break;
    order.push(next.key);
  }
  controller.abort(new Error('done'));
  await limiter.release(current);
  await until(async () => (await limiter.stats()).queued === 0, 'the queue emptied');
  return order;
}

describeWith({ PostgreSQL: postgresConfig })('starvation bound, on PostgreSQL', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('fair');
  const made: Limiter[] = [];
  let counter = 0;
  const make = () => {
    const limiter = createPostgresConcurrencyLimiter({
      db: pool,
      schema,
      name: `fair-${++counter}`,
      maxConcurrent: 1,
    });
    made.push(limiter);
    return limiter;
  };
  beforeAll(() => {
    pool = createPool(8);
  });
  afterAll(async () => {
    for (const limiter of made) await limiter.close();
    await pool.end();
  });

  it("with 1,000 requests of key A queued, key B's request is granted within 2 grants (2 active keys)", async () => {
    const limiter = make();
    expect(await grantsBeforeProbe(limiter, { holderKey: 'A', burst: [['A', 1000]], probe: 'B' })).toEqual(
      [],
    );
    // The same limiter again: the virtual time has moved on, the rule has not.
    expect(await grantsBeforeProbe(limiter, { holderKey: 'H', burst: [['A', 1000]], probe: 'B' })).toEqual([
      'A',
    ]);
    // What the database remembers: the keys granted at the current virtual time (H directly,
    // then A and B at the same tag), no more.
    const keys = await pool.query<{ n: number; older: number }>(
      `SELECT count(*)::int AS n, count(*) FILTER (WHERE last_tag < (SELECT max(last_tag)
         FROM "${schema}".concurrency_fair_keys WHERE limiter = $1::text))::int AS older
       FROM "${schema}".concurrency_fair_keys WHERE limiter = $1::text`,
      [limiter.name],
    );
    expect(keys.rows[0]).toEqual({ n: 3, older: 0 });
  }, 120_000);

  it('keys of one request each are not all remembered (the key table does not grow per request)', async () => {
    const limiter = make();
    // Granted at once, one after another: each at the same virtual time, which never moves on.
    for (let i = 0; i < 200; i++) await limiter.release(await limiter.acquire({ key: `once-${i}` }));
    const keys = await pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM "${schema}".concurrency_fair_keys WHERE limiter = $1::text`,
      [limiter.name],
    );
    expect(keys.rows[0]!.n).toBeLessThanOrEqual(1);
  }, 120_000);

  it('without keys a burst holds the request back by all of it (the control)', async () => {
    // 100, not 1,000: each grant here is a release and a pass, and the point is only that the
    // same harness sees plain FIFO when nobody gives a key.
    const order = await grantsBeforeProbe(make(), {
      holderKey: undefined,
      burst: [[undefined, 100]],
      probe: null,
    });
    expect(order).toHaveLength(100);
  }, 120_000);

  it('three active keys: at most 2 grants of other keys come first', async () => {
    const order = await grantsBeforeProbe(make(), {
      holderKey: 'C',
      burst: [
        ['A', 300],
        ['C', 300],
      ],
      probe: 'B',
    });
    expect(order.length).toBeLessThanOrEqual(2);
  }, 120_000);
});
