/**
 * What to do after a provider request failed: the policy as one pure function, so every rule
 * can be tested without a provider. In order:
 *
 * 1. an authentication failure (401, 403) or a rate limit (429) moves to the next credential
 *    at once, while there is one;
 * 2. a failure that sending again cannot fix fails the turn;
 * 3. so does a transient one (408, 409, 429, 5xx, "overloaded", a dropped connection) once
 *    `maxRetries` retries are spent;
 * 4. otherwise wait (the provider's named wait, else exponential backoff with full jitter)
 *    and retry, unless the run's budget ends before the wait does.
 *
 * @example
 * decideRetry(
 *   { text: '429 Too many requests', status: 429, headers: { retryAfter: '2' } },
 *   { retries: 0, credential: 0, credentials: 1, now, deadline: undefined, random: Math.random() },
 *   { maxRetries: 3, baseDelayMs: 500, maxDelayMs: 30_000 },
 * ); // { kind: 'retry', delayMs: 2000 }
 */

/** A failed attempt as the provider request saw it. */
export interface FailedAttempt {
  /** The error text pi-ai reports (the SDKs put the HTTP status first: "429 Too many requests"). */
  readonly text: string;
  /** The HTTP status seen on the wire, when a response came at all. */
  readonly status: number | undefined;
  /** The wait headers of the error response, as sent. */
  readonly headers?: { readonly retryAfterMs?: string | undefined; readonly retryAfter?: string | undefined };
}

/** Where the turn stands. */
export interface RetryState {
  /** Retries already made in this turn (credential moves and context compaction are not retries). */
  readonly retries: number;
  /** Index of the credential just used, of `credentials`. */
  readonly credential: number;
  readonly credentials: number;
  readonly now: number;
  /** The run's deadline, in the same clock as `now`. */
  readonly deadline: number | undefined;
  /** A number in [0, 1) for the jitter. */
  readonly random: number;
}

export interface RetryPolicy {
  readonly maxRetries: number;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
}

export type RetryDecision =
  | { readonly kind: 'next-credential' }
  | { readonly kind: 'retry'; readonly delayMs: number }
  | {
      readonly kind: 'fail';
      readonly status: number | undefined;
      /** Whether sending again could have succeeded (it was transient). */
      readonly retryable: boolean;
      readonly message: string;
    };

const transientPattern =
  /ECONNRESET|ECONNREFUSED|EPIPE|socket hang up|terminated|Connection error|fetch failed|other side closed|overloaded/i;

/** The HTTP status: the one seen on the wire, else the one the SDK wrote at the start of its message. */
export function statusOf(attempt: FailedAttempt): number | undefined {
  if (attempt.status !== undefined) return attempt.status;
  const match = /^(\d{3})\b/.exec(attempt.text);
  return match ? Number(match[1]) : undefined;
}

/** Whether sending the same request again could succeed. */
export function isTransient(status: number | undefined, text: string): boolean {
  return (
    status === 429 ||
    status === 408 ||
    status === 409 ||
    (status !== undefined && status >= 500) ||
    transientPattern.test(text)
  );
}

/**
 * The wait the provider asks for, in ms: `retry-after-ms`, else `retry-after` (seconds or an
 * HTTP date), else a wait written in the message ("Please try again in 2.5s", "retry after
 * 300ms"), because pi-ai passes only the message of an error on and providers often repeat
 * the wait there.
 */
export function providerWaitMs(attempt: FailedAttempt, now: number): number | undefined {
  const ms = attempt.headers?.retryAfterMs;
  if (ms !== undefined && Number.isFinite(Number(ms))) return Math.max(0, Number(ms));
  const header = attempt.headers?.retryAfter;
  if (header !== undefined) {
    const seconds = Number(header);
    if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
    const date = Date.parse(header);
    if (!Number.isNaN(date)) return Math.max(0, date - now);
  }
  const hinted = /(?:try again in|retry[- ]after)[^0-9]*(\d+(?:\.\d+)?)\s*(ms|s)?/i.exec(attempt.text);
  if (!hinted) return undefined;
  return hinted[2] === 'ms' ? Number(hinted[1]) : Number(hinted[1]) * 1000;
}

/** Exponential backoff with full jitter: a random wait below `base * 2^retries`, capped. */
export function backoffMs(retries: number, policy: RetryPolicy, random: number): number {
  return random * Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** retries);
}

/** Decides what follows a failed attempt. Pure: time and chance come in as `state.now` and `state.random`. */
export function decideRetry(attempt: FailedAttempt, state: RetryState, policy: RetryPolicy): RetryDecision {
  const status = statusOf(attempt);
  const transient = isTransient(status, attempt.text);
  const keyProblem = status === 401 || status === 403 || status === 429;
  if (keyProblem && state.credential + 1 < state.credentials) return { kind: 'next-credential' };
  if (!transient || state.retries >= policy.maxRetries) {
    return {
      kind: 'fail',
      status,
      retryable: transient,
      message: `Provider request failed${status ? ` with HTTP ${status}` : ''}: ${attempt.text}`,
    };
  }
  const delayMs = providerWaitMs(attempt, state.now) ?? backoffMs(state.retries, policy, state.random);
  if (state.deadline !== undefined && state.now + delayMs >= state.deadline) {
    return {
      kind: 'fail',
      status,
      retryable: true,
      message: `Provider request failed and the run's budget ends before a retry: ${attempt.text}`,
    };
  }
  return { kind: 'retry', delayMs };
}
