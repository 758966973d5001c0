import type { PGlite } from '@electric-sql/pglite';
import type pg from 'pg';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { concurrencyConformanceCases } from 'sluice/concurrency';
import { createPostgresConcurrencyLimiter, type PostgresConcurrencyLimiter } from '@sluice/postgres';
import { createPGlite, createPool, postgresConfig, uniqueSchema } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgresConfig })('conformance: PostgreSQL limiter on node-postgres', () => {
  let pool: pg.Pool;
  const schema = uniqueSchema('conf');
  beforeAll(() => {
    pool = createPool(20);
  });
  afterAll(() => pool.end());

  for (const c of concurrencyConformanceCases({
    createLimiter: (options) => createPostgresConcurrencyLimiter({ ...options, db: pool, schema }),
    disposeLimiter: (limiter) => (limiter as PostgresConcurrencyLimiter<string>).close(),
    budgets: true,
  })) {
    it(c.name, () => c.run());
  }
});

describe('conformance: PostgreSQL limiter on PGlite', () => {
  let db: PGlite;
  beforeAll(async () => {
    db = await createPGlite();
  });
  afterAll(() => db.close());

  for (const c of concurrencyConformanceCases({
    createLimiter: (options) => createPostgresConcurrencyLimiter({ ...options, db }),
    disposeLimiter: (limiter) => (limiter as PostgresConcurrencyLimiter<string>).close(),
    budgets: true,
  })) {
    it(c.name, () => c.run());
  }
});
