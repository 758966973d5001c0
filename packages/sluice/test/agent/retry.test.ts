// The retry policy of provider requests, as a table: no provider, no clock, no chance.
import { describe, expect, it } from 'vitest';
import {
  backoffMs,
  decideRetry,
  isTransient,
  providerWaitMs,
  statusOf,
  type FailedAttempt,
  type RetryState,
} from '../../src/agent/retry.js';

const policy = { maxRetries: 3, baseDelayMs: 500, maxDelayMs: 30_000 };
const now = 1_700_000_000_000;
const state: RetryState = {
  retries: 0,
  credential: 0,
  credentials: 1,
  now,
  deadline: undefined,
  random: 0.5,
};
const failed = (text: string, status?: number, headers?: FailedAttempt['headers']): FailedAttempt => ({
  text,
  status,
  headers,
});

describe('decideRetry', () => {
  it.each([
    [
      'a 429 with retry-after seconds',
      failed('429 Too many requests', 429, { retryAfter: '2' }),
      {},
      { kind: 'retry', delayMs: 2000 },
    ],
    [
      'retry-after-ms wins over retry-after',
      failed('429 slow down', 429, { retryAfterMs: '250', retryAfter: '9' }),
      {},
      { kind: 'retry', delayMs: 250 },
    ],
    [
      'a 503 without a named wait: jittered backoff',
      failed('503 unavailable', 503),
      {},
      { kind: 'retry', delayMs: 250 },
    ],
    [
      'the backoff doubles with each retry',
      failed('500 oops', 500),
      { retries: 2 },
      { kind: 'retry', delayMs: 1000 },
    ],
    [
      '"overloaded" in the text is transient without a status',
      failed('Overloaded, try later'),
      {},
      { kind: 'retry', delayMs: 250 },
    ],
    ['a dropped connection is transient', failed('terminated'), {}, { kind: 'retry', delayMs: 250 }],
    [
      'the status is read from the message when the wire had none',
      failed('408 Request Timeout'),
      {},
      { kind: 'retry', delayMs: 250 },
    ],
    [
      'a 401 moves to the next credential at once',
      failed('401 Unauthorized', 401),
      { credentials: 2 },
      { kind: 'next-credential' },
    ],
    [
      'a 429 moves to the next credential before any retry',
      failed('429 rate limited', 429),
      { credentials: 2 },
      { kind: 'next-credential' },
    ],
    [
      'a 403 on the last credential fails, not retryable',
      failed('403 Forbidden', 403),
      { credential: 1, credentials: 2 },
      {
        kind: 'fail',
        status: 403,
        retryable: false,
        message: 'Provider request failed with HTTP 403: 403 Forbidden',
      },
    ],
    [
      'a 400 fails at once',
      failed('400 bad request', 400),
      {},
      {
        kind: 'fail',
        status: 400,
        retryable: false,
        message: 'Provider request failed with HTTP 400: 400 bad request',
      },
    ],
    [
      'a message with no status fails without one',
      failed('something odd'),
      {},
      {
        kind: 'fail',
        status: undefined,
        retryable: false,
        message: 'Provider request failed: something odd',
      },
    ],
    [
      'retries spent: a transient failure fails, retryable',
      failed('500 oops', 500),
      { retries: 3 },
      {
        kind: 'fail',
        status: 500,
        retryable: true,
        message: 'Provider request failed with HTTP 500: 500 oops',
      },
    ],
    [
      'a wait that reaches the deadline fails at once',
      failed('429 wait', 429, { retryAfter: '5' }),
      { deadline: now + 5000 },
      {
        kind: 'fail',
        status: 429,
        retryable: true,
        message: "Provider request failed and the run's budget ends before a retry: 429 wait",
      },
    ],
    [
      'a wait that ends before the deadline is taken',
      failed('429 wait', 429, { retryAfter: '5' }),
      { deadline: now + 5001 },
      { kind: 'retry', delayMs: 5000 },
    ],
  ] as const)('%s', (_, attempt, overrides, expected) => {
    expect(decideRetry(attempt, { ...state, ...overrides }, policy)).toEqual(expected);
  });
});

describe('the parts of the policy', () => {
  it('statusOf: the wire first, then a leading three-digit code', () => {
    expect(statusOf(failed('500 from the message', 502))).toBe(502);
    expect(statusOf(failed('429 Too many requests'))).toBe(429);
    expect(statusOf(failed('Error 429'))).toBeUndefined();
  });

  it('isTransient: 408, 409, 429, 5xx and connection failures', () => {
    expect([408, 409, 429, 500, 529].map((s) => isTransient(s, ''))).toEqual([true, true, true, true, true]);
    expect([400, 401, 403, 404, 422].map((s) => isTransient(s, ''))).toEqual([
      false,
      false,
      false,
      false,
      false,
    ]);
    expect(isTransient(undefined, 'read ECONNRESET')).toBe(true);
    expect(isTransient(undefined, 'invalid schema')).toBe(false);
  });

  it('providerWaitMs: headers in seconds, ms or as a date, else a wait named in the message', () => {
    expect(providerWaitMs(failed('', 429, { retryAfter: '1.5' }), now)).toBe(1500);
    expect(providerWaitMs(failed('', 429, { retryAfter: new Date(now + 3000).toUTCString() }), now)).toBe(
      3000,
    );
    expect(providerWaitMs(failed('', 429, { retryAfter: new Date(now - 3000).toUTCString() }), now)).toBe(0);
    expect(providerWaitMs(failed('Please try again in 2.5s.'), now)).toBe(2500);
    expect(providerWaitMs(failed('Please try again in 300ms.'), now)).toBe(300);
    expect(providerWaitMs(failed('retry-after: 3'), now)).toBe(3000);
    expect(providerWaitMs(failed('no hint here', 429, { retryAfter: 'soon' }), now)).toBeUndefined();
  });

  it('backoffMs: full jitter under base * 2^retries, capped at maxDelayMs', () => {
    expect(backoffMs(0, policy, 0)).toBe(0);
    expect(backoffMs(0, policy, 0.999)).toBeCloseTo(499.5);
    expect(backoffMs(4, policy, 0.5)).toBe(4000);
    expect(backoffMs(20, policy, 0.5)).toBe(15_000);
  });
});
