import type { ProviderRateLimits, RateLimitWindow } from './capacity-types.js';
import { parseCount, parseDecimal, parseGoDuration, parseHttpDate, parseRfc3339 } from './header-values.js';

/**
 * Response headers as a `Headers` (fetch, the provider SDKs), or as a plain object such as
 * Node's `IncomingHttpHeaders` (names in any case; a list of values is read by its first).
 */
export type HeaderSource =
  | { get(name: string): string | null }
  | { readonly [name: string]: string | number | readonly string[] | null | undefined };

type WindowName = 'requests' | 'tokens' | 'inputTokens' | 'outputTokens';

/** OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations. */
const openAi: readonly (readonly [WindowName, string])[] = [
  ['requests', 'requests'],
  ['tokens', 'tokens'],
];

/** Anthropic's `anthropic-ratelimit-{name}-{limit,remaining,reset}`, resets as RFC 3339 times. */
const anthropic: readonly (readonly [WindowName, string])[] = [
  ['requests', 'requests'],
  ['tokens', 'tokens'],
  ['inputTokens', 'input-tokens'],
  ['outputTokens', 'output-tokens'],
];

/**
 * What a provider's response headers say of its rate limits: OpenAI's and Anthropic's windows
 * (limit, remaining, time to reset), and how long to wait from `retry-after-ms`, else
 * `retry-after` (seconds or an HTTP date). Times are in ms from `now` (a reset already past is
 * 0). A header that is missing or malformed is left out; this never throws.
 *
 * @example
 * const limits = rateLimitsFromHeaders(response.headers);
 * await limiter.release(lease, { provider: { status: response.status, limits } });
 */
export function rateLimitsFromHeaders(headers: HeaderSource, now: number = Date.now()): ProviderRateLimits {
  const read = headerReader(headers);
  const limits: { -readonly [K in keyof ProviderRateLimits]: ProviderRateLimits[K] } = {};
  for (const [name, header] of openAi) {
    const window = windowOf(
      read(`x-ratelimit-limit-${header}`),
      read(`x-ratelimit-remaining-${header}`),
      parseOr(read(`x-ratelimit-reset-${header}`), parseGoDuration),
    );
    if (window) limits[name] = window;
  }
  for (const [name, header] of anthropic) {
    const resetAt = parseOr(read(`anthropic-ratelimit-${header}-reset`), parseRfc3339);
    const window = windowOf(
      read(`anthropic-ratelimit-${header}-limit`),
      read(`anthropic-ratelimit-${header}-remaining`),
      resetAt === undefined ? undefined : Math.max(0, Math.ceil(resetAt - now)),
    );
    // A response carries one provider's headers; were both there, the first read stays.
    if (window && limits[name] === undefined) limits[name] = window;
  }
  const retryAfterMs = retryAfter(read('retry-after-ms'), read('retry-after'), now);
  if (retryAfterMs !== undefined) limits.retryAfterMs = retryAfterMs;
  return limits;
}

function windowOf(
  limit: string | undefined,
  remaining: string | undefined,
  resetMs: number | undefined,
): RateLimitWindow | undefined {
  const window: { -readonly [K in keyof RateLimitWindow]: RateLimitWindow[K] } = {};
  const limitValue = parseOr(limit, parseCount);
  const remainingValue = parseOr(remaining, parseCount);
  if (limitValue !== undefined) window.limit = limitValue;
  if (remainingValue !== undefined) window.remaining = remainingValue;
  if (resetMs !== undefined) window.resetMs = resetMs;
  return Object.keys(window).length > 0 ? window : undefined;
}

/** `retry-after-ms` wins; `retry-after` is seconds or an HTTP date. */
function retryAfter(ms: string | undefined, value: string | undefined, now: number): number | undefined {
  const fromMs = parseOr(ms, parseDecimal);
  if (fromMs !== undefined) return Math.ceil(fromMs);
  const seconds = parseOr(value, parseDecimal);
  if (seconds !== undefined) return Math.ceil(seconds * 1_000);
  const at = value === undefined ? undefined : parseHttpDate(value, now);
  return at === undefined ? undefined : Math.max(0, at - now);
}

function parseOr(
  value: string | undefined,
  parse: (value: string) => number | undefined,
): number | undefined {
  return value === undefined ? undefined : parse(value);
}

/** A lookup by lower-case name that trims the value; undefined for a missing or empty one. */
function headerReader(headers: HeaderSource): (name: string) => string | undefined {
  if (typeof headers !== 'object' || headers === null) return () => undefined;
  if (typeof headers.get === 'function') {
    const source = headers as { get(name: string): unknown };
    return (name) => {
      try {
        return clean(source.get(name));
      } catch {
        return undefined; // a Headers look-alike that throws says nothing
      }
    };
  }
  // Own names only, into a Map: a `__proto__` or `constructor` header is just a name.
  const byName = new Map<string, unknown>();
  for (const [name, value] of Object.entries(headers)) {
    const key = name.toLowerCase();
    if (!byName.has(key)) byName.set(key, value);
  }
  return (name) => {
    const value = byName.get(name);
    return clean(Array.isArray(value) ? (value as unknown[])[0] : value);
  };
}

function clean(value: unknown): string | undefined {
  const text =
    typeof value === 'number' ? String(value) : typeof value === 'string' ? value.trim() : undefined;
  return text === '' ? undefined : text;
}
