// When the provider's feedback pauses a limiter, and for how long, as the slot reports it to
// a run's listeners (`provider-throttled`): a table.
import { describe, expect, it } from 'vitest';
import { pauseOf, statusOf } from '../../src/concurrency/capacity.js';
import type { ProviderFeedback } from '../../src/concurrency/capacity-types.js';

describe('pauseOf', () => {
  it.each<[string, ProviderFeedback, { status: number | undefined; retryAfterMs: number } | undefined]>([
    [
      'a 429 with the wait it names',
      { status: 429, retryAfterMs: 2_500 },
      { status: 429, retryAfterMs: 2_500 },
    ],
    [
      "a 429 whose wait is only in its headers' figures",
      { status: 429, limits: { retryAfterMs: 700 } },
      { status: 429, retryAfterMs: 700 },
    ],
    ['a 503 naming no wait: 1 s', { status: 503 }, { status: 503, retryAfterMs: 1_000 }],
    ['a 529 (Anthropic overloaded)', { status: 529, retryAfterMs: 0 }, { status: 529, retryAfterMs: 0 }],
    [
      'a 200 with a window spent: until its reset',
      {
        status: 200,
        limits: { tokens: { remaining: 0, resetMs: 4_000 }, requests: { remaining: 0, resetMs: 9_000 } },
      },
      { status: 200, retryAfterMs: 9_000 },
    ],
    [
      'a 429 with a spent window and a named wait: the named wait',
      { status: 429, retryAfterMs: 300, limits: { tokens: { remaining: 0, resetMs: 4_000 } } },
      { status: 429, retryAfterMs: 300 },
    ],
    [
      'a negative or NaN wait is no wait: 1 s',
      { status: 429, retryAfterMs: -5, limits: { retryAfterMs: Number.NaN } },
      { status: 429, retryAfterMs: 1_000 },
    ],
    [
      'a 200 with room left',
      { status: 200, limits: { requests: { remaining: 3, resetMs: 100 } } },
      undefined,
    ],
    ['a 500 (a fault, not overload)', { status: 500 }, undefined],
    ['no status at all', {}, undefined],
    [
      'a wait past a minute: a minute',
      { status: 429, retryAfterMs: 3_600_000 },
      { status: 429, retryAfterMs: 60_000 },
    ],
  ])('%s', (_, feedback, expected) => {
    const pauseMs = pauseOf(feedback);
    expect(pauseMs === undefined ? undefined : { status: statusOf(feedback), retryAfterMs: pauseMs }).toEqual(
      expected,
    );
  });
});
