/**
 * What one delivery attempt's outcome means, as one pure policy:
 *
 * - 2xx: delivered.
 * - Network errors, timeouts, 408, 429 and 5xx: the receiver may answer later; retry with
 *   exponential backoff (base * 2^(attempts-1), capped, jittered down to half), and never
 *   sooner than a Retry-After (bounded, so a receiver cannot park a row for a year).
 * - 3xx: redirects are not followed (a redirect could point inside the network), and a
 *   receiver that moved will not stop moving: failed.
 * - Other 4xx, and a destination refused at connect time: retrying cannot help: failed.
 */

export type AttemptOutcome =
  | { kind: 'response'; status: number; retryAfter?: string | undefined }
  | { kind: 'network'; message: string }
  | { kind: 'timeout'; afterMs: number }
  | { kind: 'refused'; message: string };

export type Verdict =
  | { kind: 'delivered'; status: number }
  | { kind: 'retry'; status: number | null; reason: string; retryAfterMs?: number | undefined }
  | { kind: 'failed'; status: number | null; reason: string };

export interface Backoff {
  retryBaseMs: number;
  retryMaxMs: number;
  maxRetryAfterMs: number;
}

const retriedStatuses = new Set([408, 429]);

/** The verdict on one attempt; `now` (epoch ms) reads an HTTP-date Retry-After. */
export function judgeAttempt(outcome: AttemptOutcome, now: number): Verdict {
  switch (outcome.kind) {
    case 'network':
      return { kind: 'retry', status: null, reason: `network error: ${outcome.message}` };
    case 'timeout':
      return { kind: 'retry', status: null, reason: `no response within ${outcome.afterMs} ms` };
    case 'refused':
      return { kind: 'failed', status: null, reason: outcome.message };
    case 'response': {
      const { status } = outcome;
      if (status >= 200 && status < 300) return { kind: 'delivered', status };
      if (status >= 300 && status < 400) {
        return { kind: 'failed', status, reason: `HTTP ${status}: redirects are not followed` };
      }
      if (retriedStatuses.has(status) || (status >= 500 && status < 600)) {
        return {
          kind: 'retry',
          status,
          reason: `HTTP ${status}`,
          retryAfterMs: parseRetryAfter(outcome.retryAfter, now),
        };
      }
      return { kind: 'failed', status, reason: `HTTP ${status}: not retried` };
    }
    default: {
      const never: never = outcome;
      throw new Error(`unknown attempt outcome ${JSON.stringify(never)}`);
    }
  }
}

/**
 * The wait before the next attempt, after `attempts` attempts. `random` in [0, 1) picks the
 * jitter: 1 gives the full delay, 0 half of it.
 *
 * @example
 * retryDelayMs(1, { retryBaseMs: 5000, retryMaxMs: 3_600_000, maxRetryAfterMs: 3_600_000 }, () => 1); // 5000
 */
export function retryDelayMs(
  attempts: number,
  backoff: Backoff,
  random: () => number,
  retryAfterMs?: number,
): number {
  const exponent = Math.min(Math.max(attempts - 1, 0), 52);
  const full = Math.min(backoff.retryMaxMs, backoff.retryBaseMs * 2 ** exponent);
  const jittered = Math.round(full * (0.5 + 0.5 * Math.min(Math.max(random(), 0), 1)));
  if (retryAfterMs === undefined) return jittered;
  return Math.max(jittered, Math.min(retryAfterMs, backoff.maxRetryAfterMs));
}

/** Retry-After as delay-seconds or an HTTP-date, in ms from `now`; undefined when unreadable. */
export function parseRetryAfter(value: string | undefined, now: number): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  // HTTP-dates always name a weekday ("Wed, 21 Oct 2015 07:28:00 GMT"); a bare number
  // such as "1.5" or "-1" is malformed, not a date for Date.parse to guess at.
  if (!/^[A-Za-z]{3},/.test(text)) return undefined;
  const at = Date.parse(text);
  return Number.isFinite(at) ? Math.max(0, at - now) : undefined;
}
