import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { concurrencyConformanceCases } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import { pgbouncerConfig, uniqueSchema, until } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

// PgBouncer in transaction mode gives each transaction whichever server connection is free:
// nothing may depend on session state, and LISTEN cannot work (the limiter finds that out and
// polls). The vitest global setup starts it (see scripts/vitest-global-setup.ts).
describeWith({ PgBouncer: pgbouncerConfig })('PostgreSQL limiter behind PgBouncer (transaction mode)', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('bouncer');
  beforeAll(() => {
    pool = new pg.Pool({ ...pgbouncerConfig, max: 20 });
  });
  afterAll(() => pool.end());

  it('is really behind PgBouncer in transaction mode', async () => {
    const a = new pg.Client(pgbouncerConfig);
    const b = new pg.Client(pgbouncerConfig);
    await a.connect();
    await b.connect();
    try {
      const pid = async (c: pg.Client) =>
        (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      const first = await pid(a);
      await b.query('BEGIN');
      const held = await pid(b);
      const second = await pid(a);
      await b.query('COMMIT');
      // b's transaction took the server session a had just given back (PgBouncer reuses the
      // last one first), so a's next statement ran on another session.
      expect(held).toBe(first);
      expect(second).not.toBe(first);
    } finally {
      await a.end();
      await b.end();
    }
  });

  it('finds that LISTEN does not work here, and hands slots on by polling', async () => {
    const other = new pg.Pool({ ...pgbouncerConfig, max: 4 }); // a second "process"
    const opened: PostgresConcurrencyLimiter<string>[] = [];
    try {
      const a = createPostgresConcurrencyLimiter({ db: pool, schema, name: 'handoff', maxConcurrent: 1 });
      const b = createPostgresConcurrencyLimiter({ db: other, schema, name: 'handoff', maxConcurrent: 1 });
      opened.push(a, b);
      for (let i = 0; i < 3; i++) {
        const held = await a.acquire({ timeoutMs: 20_000 });
        const waiting = b.acquire({ timeoutMs: 20_000 });
        await until(async () => (await a.stats()).queued === 1, 'b is queued');
        await a.release(held);
        await b.release(await waiting);
      }
      expect(b.wakeups).toBe('polling');
      expect(b.metrics.offersClaimedOnPoll).toBe(3);
      expect(b.metrics.offersClaimedOnNotify).toBe(0);
    } finally {
      for (const l of opened) await l.close();
      await other.end();
    }
  });

  for (const c of concurrencyConformanceCases({
    createLimiter: (options) => createPostgresConcurrencyLimiter({ ...options, db: pool, schema }),
    disposeLimiter: (limiter) => (limiter as PostgresConcurrencyLimiter<string>).close(),
  })) {
    it(`conformance: ${c.name}`, () => c.run());
  }
});
