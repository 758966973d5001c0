import { describe, expect, it } from 'vitest';
import { ConcurrencyConfigError, ManualClock, systemClock } from 'sluice/concurrency';
import type { Database } from '../../src/database.js';
import { postgresDefaults, resolvePostgresLimiterOptions } from '../../src/options.js';

// Resolving options never touches the database: any object with query and transaction will do.
const db: Database = {
  query: () => Promise.reject(new Error('not used')),
  transaction: () => Promise.reject(new Error('not used')),
};

function configError(options: Record<string, unknown>): ConcurrencyConfigError {
  try {
    resolvePostgresLimiterOptions({ maxConcurrent: 2, db, ...options } as never);
  } catch (error) {
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    return error as ConcurrencyConfigError;
  }
  throw new Error('expected ConcurrencyConfigError');
}

describe('PostgreSQL limiter options', () => {
  it('fills every default from one object', () => {
    const { settings, clock, database } = resolvePostgresLimiterOptions({
      maxConcurrent: 2,
      db,
      leaseTtlMs: 3000,
    });
    expect(settings).toEqual({
      schema: 'sluice',
      pollIntervalMs: 100,
      fallbackPollIntervalMs: 1000,
      queueEntryTtlMs: 15_000,
      offerTtlMs: 3000, // the lease TTL, under the 5 s cap
      outageGraceMs: 5000,
      ensureSchema: true,
      onConflict: 'error',
      listen: true,
      synchronousCommit: true,
    });
    expect(Object.isFrozen(settings)).toBe(true);
    expect(clock).toBe(systemClock);
    expect(database).toBe(db);
    expect(resolvePostgresLimiterOptions({ maxConcurrent: 2, db }).settings.offerTtlMs).toBe(
      postgresDefaults.maxOfferTtlMs,
    );
    // The slow poll is never faster than the routine one.
    expect(
      resolvePostgresLimiterOptions({ maxConcurrent: 2, db, pollIntervalMs: 2500 }).settings
        .fallbackPollIntervalMs,
    ).toBe(2500);
  });

  it('takes the clock option', () => {
    const manual = new ManualClock();
    expect(resolvePostgresLimiterOptions({ maxConcurrent: 2, db, clock: manual }).clock).toBe(manual);
  });

  it.each([
    [
      { db: undefined },
      'db',
      'Expected `db` to be a pg.Pool, a PGlite instance or a Database, got `undefined`',
    ],
    [
      { db: { query: 1 } },
      'db',
      'Expected `db` to be a pg.Pool, a PGlite instance or a Database, got `{"query":1}`',
    ],
    [
      { schema: 'bad; drop' },
      'schema',
      'Expected `schema` to be a plain SQL identifier (letters, digits, _; at most 63), got `"bad; drop"`',
    ],
    [
      { onConflict: 'merge' },
      'onConflict',
      "Expected `onConflict` to be 'error' or 'replace', got `\"merge\"`",
    ],
    [{ pollIntervalMs: 0 }, 'pollIntervalMs', 'Expected `pollIntervalMs` to be a whole number >= 1, got `0`'],
    [{ pollIntervalMs: 2.5 }, 'pollIntervalMs', 'got `2.5`'],
    [
      { pollIntervalMs: 500, fallbackPollIntervalMs: 200 },
      'fallbackPollIntervalMs',
      'Expected `fallbackPollIntervalMs` to be a whole number >= 500 (pollIntervalMs), got `200`',
    ],
    [
      { queueEntryTtlMs: '15s' },
      'queueEntryTtlMs',
      'Expected `queueEntryTtlMs` to be a whole number >= 1, got `"15s"`',
    ],
    [{ offerTtlMs: 0 }, 'offerTtlMs', 'got `0`'],
    [{ outageGraceMs: -1 }, 'outageGraceMs', 'Expected `outageGraceMs` to be a whole number >= 0, got `-1`'],
    [{ listen: 'no' }, 'listen', 'Expected `listen` to be true or false, got `"no"`'],
    [{ ensureSchema: 0 }, 'ensureSchema', 'Expected `ensureSchema` to be true or false, got `0`'],
    [{ synchronousCommit: null }, 'synchronousCommit', 'got `null`'],
    [{ queueEntryTtl: 5 }, 'queueEntryTtl', 'Expected `queueEntryTtl` to be a known option'],
    [{ maxConcurrent: 0 }, 'maxConcurrent', 'Expected `maxConcurrent` to be a whole number >= 1, got `0`'],
  ])('refuses %j, naming %s', (options, field, message) => {
    const error = configError(options);
    expect(error.field).toBe(field);
    expect(error.message).toContain(message);
    expect(error.limiter).toBe('default');
  });
});
