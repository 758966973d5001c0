import { describe, expect, it } from 'vitest';
import { resolveDispatcherOptions, type CallbackDispatcherOptions } from '../../src/callbacks/options.js';
import {
  judgeAttempt,
  parseRetryAfter,
  retryDelayMs,
  type AttemptOutcome,
} from '../../src/callbacks/retry.js';
import type { Database } from '@sluice/postgres/database';

const now = Date.parse('2030-01-01T00:00:00Z');
const response = (status: number, retryAfter?: string): AttemptOutcome => ({
  kind: 'response',
  status,
  retryAfter,
});

describe('judgeAttempt', () => {
  it.each([
    [response(200), { kind: 'delivered', status: 200 }],
    [response(204), { kind: 'delivered', status: 204 }],
    [response(299), { kind: 'delivered', status: 299 }],
    [response(301), { kind: 'failed', status: 301, reason: 'HTTP 301: redirects are not followed' }],
    [response(307), { kind: 'failed', status: 307, reason: 'HTTP 307: redirects are not followed' }],
    [response(400), { kind: 'failed', status: 400, reason: 'HTTP 400: not retried' }],
    [response(401), { kind: 'failed', status: 401, reason: 'HTTP 401: not retried' }],
    [response(404), { kind: 'failed', status: 404, reason: 'HTTP 404: not retried' }],
    [response(410), { kind: 'failed', status: 410, reason: 'HTTP 410: not retried' }],
    [response(408), { kind: 'retry', status: 408, reason: 'HTTP 408', retryAfterMs: undefined }],
    [response(429, '30'), { kind: 'retry', status: 429, reason: 'HTTP 429', retryAfterMs: 30_000 }],
    [response(500), { kind: 'retry', status: 500, reason: 'HTTP 500', retryAfterMs: undefined }],
    [response(503, '5'), { kind: 'retry', status: 503, reason: 'HTTP 503', retryAfterMs: 5000 }],
    [response(599), { kind: 'retry', status: 599, reason: 'HTTP 599', retryAfterMs: undefined }],
    [response(600), { kind: 'failed', status: 600, reason: 'HTTP 600: not retried' }],
    [
      { kind: 'network', message: 'ECONNREFUSED' },
      { kind: 'retry', status: null, reason: 'network error: ECONNREFUSED' },
    ],
    [
      { kind: 'timeout', afterMs: 10_000 },
      { kind: 'retry', status: null, reason: 'no response within 10000 ms' },
    ],
    [
      { kind: 'refused', message: 'nope' },
      { kind: 'failed', status: null, reason: 'nope' },
    ],
  ] as [AttemptOutcome, object][])('%j', (outcome, verdict) => {
    expect(judgeAttempt(outcome, now)).toEqual(verdict);
  });
});

describe('parseRetryAfter', () => {
  it.each([
    ['0', 0],
    ['120', 120_000],
    [' 7 ', 7000],
    ['Tue, 01 Jan 2030 00:01:00 GMT', 60_000],
    ['Mon, 31 Dec 2029 23:00:00 GMT', 0],
    ['-1', undefined],
    ['1.5', undefined],
    ['soon', undefined],
    ['2030-01-01T00:01:00Z', undefined],
    [undefined, undefined],
  ])('%j', (value, ms) => {
    expect(parseRetryAfter(value, now)).toBe(ms);
  });
});

describe('retryDelayMs', () => {
  const backoff = { retryBaseMs: 5000, retryMaxMs: 60_000, maxRetryAfterMs: 120_000 };
  it('doubles per attempt up to the cap, jittered down to half', () => {
    expect([1, 2, 3, 4, 5, 6].map((n) => retryDelayMs(n, backoff, () => 1))).toEqual([
      5000, 10_000, 20_000, 40_000, 60_000, 60_000,
    ]);
    expect([1, 2, 3].map((n) => retryDelayMs(n, backoff, () => 0))).toEqual([2500, 5000, 10_000]);
    expect(retryDelayMs(1000, backoff, () => 1)).toBe(60_000);
  });

  it('waits at least a Retry-After, up to its bound', () => {
    expect(retryDelayMs(1, backoff, () => 1, 30_000)).toBe(30_000);
    expect(retryDelayMs(1, backoff, () => 1, 1000)).toBe(5000);
    expect(retryDelayMs(1, backoff, () => 1, 86_400_000)).toBe(120_000);
  });
});

describe('resolveDispatcherOptions', () => {
  const db = { query: async () => ({ rows: [] }), transaction: async () => undefined } as unknown as Database;
  const base: CallbackDispatcherOptions = { db, renderRun: async () => ({}) };

  it('fills in the defaults', () => {
    expect(resolveDispatcherOptions(base)).toMatchObject({
      allowPrivate: false,
      concurrency: 8,
      attemptTimeoutMs: 10_000,
      maxAgeMs: 86_400_000,
      leaseMs: 40_000,
      pollIntervalMs: 1000,
    });
    expect(Object.isFrozen(resolveDispatcherOptions(base))).toBe(true);
  });

  it.each([
    [{ concurrency: 0 }, 'Expected `concurrency` to be a whole number >= 1, got `0`'],
    [{ concurrency: 1.5 }, 'Expected `concurrency` to be a whole number >= 1, got `1.5`'],
    [{ attemptTimeoutMs: -1 }, 'Expected `attemptTimeoutMs` to be a whole number >= 1, got `-1`'],
    [{ maxAgeMs: Number.NaN }, 'Expected `maxAgeMs` to be a whole number >= 1, got `NaN`'],
    [{ pollIntervalMs: '5' }, 'Expected `pollIntervalMs` to be a whole number >= 1, got `5`'],
    [
      { attemptTimeoutMs: 10_000, leaseMs: 10_000 },
      'Expected `leaseMs` (10000) to be longer than `attemptTimeoutMs` (10000)',
    ],
    [{ retryBaseMs: 10, retryMaxMs: 5 }, 'Expected `retryMaxMs` (5) to be at least `retryBaseMs` (10)'],
    [{ allowPrivate: 'yes' }, 'Expected `allowPrivate` to be a boolean, got `yes`'],
    [{ renderRun: undefined }, 'Expected `renderRun` to be a function, got `undefined`'],
    [{ db: {} }, 'Expected `db` to be a Database from @sluice/postgres/database'],
    [{ random: 3 }, 'Expected `random` to be a function, got `number`'],
  ])('%j', (patch, message) => {
    expect(() =>
      resolveDispatcherOptions({ ...base, ...(patch as object) } as CallbackDispatcherOptions),
    ).toThrow(message);
  });
});
