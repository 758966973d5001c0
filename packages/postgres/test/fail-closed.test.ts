import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { ConcurrencyLimiterError, acquireSlot, type ConcurrencyEvent } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPool, postgresConfig, uniqueSchema } from './helpers.js';

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

  it.runIf(postgresConfig)(
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
