import { describe, expect, it } from 'vitest';
import { rateLimitsFromHeaders } from '../../src/concurrency/index.js';
import { rateLimitsFromHeaders as fromPackageRoot } from '../../src/index.js';

const now = Date.UTC(2025, 7, 21, 12, 40, 30); // 2025-08-21T12:40:30Z

describe('rateLimitsFromHeaders: real header sets', () => {
  it("reads OpenAI's headers with the sample values of its rate-limit guide", () => {
    // The sample values of the "Rate limits in headers" table,
    // https://platform.openai.com/docs/guides/rate-limits (as of 2026).
    const headers = new Headers({
      'x-ratelimit-limit-requests': '60',
      'x-ratelimit-limit-tokens': '150000',
      'x-ratelimit-remaining-requests': '59',
      'x-ratelimit-remaining-tokens': '149984',
      'x-ratelimit-reset-requests': '1s',
      'x-ratelimit-reset-tokens': '6m0s',
    });
    expect(rateLimitsFromHeaders(headers, now)).toEqual({
      requests: { limit: 60, remaining: 59, resetMs: 1_000 },
      tokens: { limit: 150_000, remaining: 149_984, resetMs: 360_000 },
    });
  });

  it('reads a chat-completions response of OpenAI, with its extra usage-based headers ignored', () => {
    // A response's headers as posted at
    // https://community.openai.com/t/how-to-get-rate-limit-reset-time-for-response-api/1268905
    const headers = {
      date: 'Mon, 26 May 2025 05:00:04 GMT',
      'content-type': 'application/json',
      'x-ratelimit-limit-requests': '5000',
      'x-ratelimit-limit-tokens': '160000',
      'x-ratelimit-limit-tokens_usage_based': '160000',
      'x-ratelimit-remaining-requests': '4999',
      'x-ratelimit-remaining-tokens': '159976',
      'x-ratelimit-remaining-tokens_usage_based': '159976',
      'x-ratelimit-reset-requests': '12ms',
      'x-ratelimit-reset-tokens': '9ms',
      'x-ratelimit-reset-tokens_usage_based': '9ms',
    };
    expect(rateLimitsFromHeaders(headers, now)).toEqual({
      requests: { limit: 5_000, remaining: 4_999, resetMs: 12 },
      tokens: { limit: 160_000, remaining: 159_976, resetMs: 9 },
    });
  });

  it('reads an Anthropic messages response, every window, a reset already past as 0', () => {
    // A recorded response of api.anthropic.com (Thu, 21 Aug 2025 12:41:00 GMT), the fixture
    // tests/testthat/claude/api.anthropic.com/v1/messages-e050b5-POST.R of CRAN's tidyllm.
    const headers = new Headers({
      date: 'Thu, 21 Aug 2025 12:41:00 GMT',
      'anthropic-ratelimit-input-tokens-limit': '80000',
      'anthropic-ratelimit-input-tokens-remaining': '80000',
      'anthropic-ratelimit-input-tokens-reset': '2025-08-21T12:40:59Z',
      'anthropic-ratelimit-output-tokens-limit': '16000',
      'anthropic-ratelimit-output-tokens-remaining': '16000',
      'anthropic-ratelimit-output-tokens-reset': '2025-08-21T12:41:00Z',
      'anthropic-ratelimit-requests-limit': '1000',
      'anthropic-ratelimit-requests-remaining': '999',
      'anthropic-ratelimit-requests-reset': '2025-08-21T12:40:59Z',
      'anthropic-ratelimit-tokens-limit': '96000',
      'anthropic-ratelimit-tokens-remaining': '96000',
      'anthropic-ratelimit-tokens-reset': '2025-08-21T12:40:59Z',
      'request-id': 'req_011CSLsW7mFqvHHnzrKdKjAE',
    });
    const at = Date.UTC(2025, 7, 21, 12, 41, 0);
    expect(rateLimitsFromHeaders(headers, at)).toEqual({
      requests: { limit: 1_000, remaining: 999, resetMs: 0 },
      tokens: { limit: 96_000, remaining: 96_000, resetMs: 0 },
      inputTokens: { limit: 80_000, remaining: 80_000, resetMs: 0 },
      outputTokens: { limit: 16_000, remaining: 16_000, resetMs: 0 },
    });
    // Read 30 s before the response's date, the same resets are 29 and 30 s away.
    const earlier = rateLimitsFromHeaders(headers, now);
    expect(earlier.requests?.resetMs).toBe(29_000);
    expect(earlier.outputTokens?.resetMs).toBe(30_000);
  });

  it("reads an Anthropic 429's retry-after and its exhausted window", () => {
    // Header names as listed at https://docs.aws.amazon.com/claude-platform/latest/userguide/rate-limits.html
    // (which mirrors Anthropic's rate-limit page); the figures are ours, not a recorded answer.
    const headers = {
      'retry-after': '20',
      'anthropic-ratelimit-output-tokens-limit': '8000',
      'anthropic-ratelimit-output-tokens-remaining': '0',
      'anthropic-ratelimit-output-tokens-reset': '2025-08-21T12:40:50Z',
    };
    expect(rateLimitsFromHeaders(headers, now)).toEqual({
      outputTokens: { limit: 8_000, remaining: 0, resetMs: 20_000 },
      retryAfterMs: 20_000,
    });
  });

  it("ignores Azure OpenAI's -1 figures and reads its bare 0 reset", () => {
    // A Responses API answer of Azure OpenAI, as reported at
    // https://learn.microsoft.com/en-us/answers/questions/5625878/
    const headers = {
      'x-ratelimit-limit-tokens': '-1',
      'x-ratelimit-remaining-tokens': '-1',
      'x-ratelimit-reset-tokens': '0',
    };
    expect(rateLimitsFromHeaders(headers, now)).toEqual({ tokens: { resetMs: 0 } });
  });

  it('is exported from sluice as from sluice/concurrency, and defaults now to the system clock', () => {
    expect(fromPackageRoot).toBe(rateLimitsFromHeaders);
    const inAMinute = new Date(Date.now() + 60_000).toISOString();
    const resetMs = rateLimitsFromHeaders({ 'anthropic-ratelimit-requests-reset': inAMinute }).requests
      ?.resetMs;
    expect(resetMs).toBeGreaterThan(50_000);
    expect(resetMs).toBeLessThanOrEqual(60_000);
  });
});

describe('rateLimitsFromHeaders: OpenAI reset durations (Go syntax)', () => {
  it.each([
    ['6m0s', 360_000],
    ['1.5s', 1_500],
    ['12ms', 12],
    ['1h2m3.5s', 3_723_500],
    ['0s', 0],
    ['2m59.56s', 179_560],
    ['500us', 1], // rounded up: a wait is never cut short
    ['500µs', 1],
    ['1500ns', 1],
    ['.5s', 500],
    ['20', 20_000], // a bare number is seconds
    ['0', 0],
  ])('%s is %d ms', (value, ms) => {
    expect(rateLimitsFromHeaders({ 'x-ratelimit-reset-requests': value }, now)).toEqual({
      requests: { resetMs: ms },
    });
  });

  it.each([
    '-1s',
    '+1s',
    '1x',
    's',
    '1s2',
    '1 s',
    '1.2.3s',
    'NaN',
    'Infinity',
    '1e999',
    '1e3s',
    '99999999999999h', // past Go's int64 of nanoseconds
    '6m0s; 1s',
    'PT1S',
  ])('ignores the garbage duration %j', (value) => {
    const parsed = rateLimitsFromHeaders(
      { 'x-ratelimit-reset-requests': value, 'x-ratelimit-limit-requests': '5' },
      now,
    );
    expect(parsed).toEqual({ requests: { limit: 5 } });
  });
});

describe('rateLimitsFromHeaders: retry-after', () => {
  it.each([
    [{ 'retry-after': '20' }, 20_000],
    [{ 'retry-after': '0' }, 0],
    [{ 'retry-after': '1.5' }, 1_500],
    [{ 'retry-after-ms': '250' }, 250],
    [{ 'retry-after-ms': '250.2' }, 251],
    [{ 'retry-after-ms': '250', 'retry-after': '20' }, 250], // the ms header wins
    [{ 'retry-after-ms': 'soon', 'retry-after': '20' }, 20_000], // ...when it is readable
    [{ 'retry-after': 'Thu, 21 Aug 2025 12:41:00 GMT' }, 30_000], // an IMF-fixdate
    [{ 'retry-after': 'Thursday, 21-Aug-25 12:41:00 GMT' }, 30_000], // RFC 850
    [{ 'retry-after': 'Thu Aug 21 12:41:00 2025' }, 30_000], // asctime, in GMT
    [{ 'retry-after': 'Thu, 21 Aug 2025 12:00:00 GMT' }, 0], // a date already past
  ])('%j waits %d ms', (headers, ms) => {
    expect(rateLimitsFromHeaders(headers, now)).toEqual({ retryAfterMs: ms });
  });

  it.each([
    '-5',
    'NaN',
    '1e999',
    'Infinity',
    '',
    '   ',
    'soon',
    'Thu, 32 Aug 2025 12:41:00 GMT',
    'Thu, 31 Feb 2025 12:41:00 GMT',
    'Thu, 21 Aug 2025 25:41:00 GMT',
    'Thu, 21 Aug 2025 12:41:00 PST',
    '2025-08-21T12:41:00Z', // an RFC 3339 time is not an HTTP date
  ])('ignores retry-after %j', (value) => {
    expect(rateLimitsFromHeaders({ 'retry-after': value, 'retry-after-ms': value }, now)).toEqual({});
  });
});

describe('rateLimitsFromHeaders: hostile and odd input', () => {
  it('reads names in any case from a plain object, and the first of a list', () => {
    const headers = {
      'X-RateLimit-Remaining-Requests': ['7', '8'],
      'X-RATELIMIT-LIMIT-REQUESTS': 10,
      'Retry-After-Ms': ' 40 ',
    };
    expect(rateLimitsFromHeaders(headers, now)).toEqual({
      requests: { limit: 10, remaining: 7 },
      retryAfterMs: 40,
    });
  });

  it('reads duplicate Headers values as unreadable, not as the first', () => {
    const headers = new Headers();
    headers.append('x-ratelimit-remaining-tokens', '10');
    headers.append('x-ratelimit-remaining-tokens', '20'); // get() gives "10, 20"
    expect(rateLimitsFromHeaders(headers, now)).toEqual({});
  });

  it.each([
    ['a negative count', '-1'],
    ['NaN', 'NaN'],
    ['1e999', '1e999'],
    ['a fraction', '1.5'],
    ['empty', ''],
    ['a count past 2^53', '9007199254740993'],
    ['400 digits', '9'.repeat(400)],
    ['hex', '0x10'],
  ])('ignores %s as a count', (_, value) => {
    expect(
      rateLimitsFromHeaders(
        { 'x-ratelimit-limit-tokens': value, 'anthropic-ratelimit-requests-remaining': value },
        now,
      ),
    ).toEqual({});
  });

  it.each([
    '2025-08-21',
    '2025-08-21T12:41:00', // no offset
    '2025-02-30T12:41:00Z',
    '2025-08-21T24:00:00Z',
    '2025-08-21T12:41:00+25:00',
    'Thu, 21 Aug 2025 12:41:00 GMT',
    '6m0s',
    '0021-08-21T12:41:00Z',
  ])('ignores the Anthropic reset %j', (value) => {
    expect(rateLimitsFromHeaders({ 'anthropic-ratelimit-tokens-reset': value }, now)).toEqual({});
  });

  it('reads RFC 3339 offsets and fractions', () => {
    const parsed = rateLimitsFromHeaders(
      {
        'anthropic-ratelimit-requests-reset': '2025-08-21T14:41:00.250+02:00',
        'anthropic-ratelimit-tokens-reset': '2025-08-21t12:40:31.0001z',
      },
      now,
    );
    expect(parsed).toEqual({ requests: { resetMs: 30_250 }, tokens: { resetMs: 1_001 } });
  });

  it('treats __proto__, constructor and a header named get as names, polluting nothing', () => {
    const headers = JSON.parse(
      '{"__proto__": {"x-ratelimit-limit-requests": "5"}, "constructor": "1", "get": "2", "retry-after": "3"}',
    ) as Record<string, string>;
    expect(rateLimitsFromHeaders(headers, now)).toEqual({ retryAfterMs: 3_000 });
    expect(({} as Record<string, unknown>)['x-ratelimit-limit-requests']).toBeUndefined();
    // A prototype's headers are not the object's own.
    const inherited = Object.create({ 'retry-after': '9' }) as Record<string, string>;
    expect(rateLimitsFromHeaders(inherited, now)).toEqual({});
  });

  it('returns nothing, and throws nothing, for what is not headers', () => {
    for (const value of [undefined, null, 42, 'retry-after: 5', [], {}]) {
      expect(rateLimitsFromHeaders(value as never, now)).toEqual({});
    }
    const throwing = {
      get() {
        throw new Error('boom');
      },
    };
    expect(rateLimitsFromHeaders(throwing, now)).toEqual({});
  });
});
