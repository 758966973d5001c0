import type { LimitName, StandInLimits } from './types.js';

const MINUTE = 60_000;

/** A per-minute budget: holds at most `capacity`, starts full, refills at capacity per minute. */
class Bucket {
  #level: number;
  #at: number;

  constructor(
    readonly capacity: number,
    now: number,
  ) {
    this.#level = capacity;
    this.#at = now;
  }

  level(now: number): number {
    // A clock that steps back refills nothing.
    const elapsed = Math.max(0, now - this.#at);
    this.#level = Math.min(this.capacity, this.#level + (elapsed * this.capacity) / MINUTE);
    this.#at = Math.max(this.#at, now);
    return this.#level;
  }

  /** Takes `amount` (a negative amount gives back, never past the capacity). */
  take(amount: number, now: number): void {
    this.#level = Math.min(this.capacity, this.level(now) - amount);
  }

  /** Time until `amount` fits, in ms. */
  waitMs(amount: number, now: number): number {
    const missing = amount - this.level(now);
    return missing <= 0 ? 0 : Math.ceil((missing * MINUTE) / this.capacity);
  }

  /** Time until the bucket is full again, in ms. */
  fullInMs(now: number): number {
    return this.waitMs(this.capacity, now);
  }
}

/** A request's claim on the account, settled when its response ends. */
export interface Admission {
  readonly tokens: number;
}

/** Why a request was refused, and how long the account says to wait (none when it can never fit). */
export interface Refusal {
  readonly limit: LimitName;
  readonly retryAfterMs: number | undefined;
  readonly message: string;
}

/** One budget's figures, as the rate-limit headers give them. */
export interface WindowFigures {
  readonly limit: number;
  readonly remaining: number;
  readonly resetMs: number;
}

/**
 * A provider account's limits, counted as providers document theirs: each per-minute limit is
 * a token bucket that starts full and refills continuously. A request is admitted when it
 * fits every limit at once: a place among `maxConcurrent`, 1 request, and its tokens, which
 * are its prompt (estimated from its size, as the stand-in's usage figures are) plus its
 * output cap (`max_tokens` or `max_completion_tokens`, 0 when it sends none), charged at
 * admission. When its response completes, the charge is settled to the usage it reported
 * (the unused output given back), as Anthropic describes for its output-token limits; a
 * response that failed or was cut keeps its admission charge.
 *
 * A refusal says when to retry: the time until its budget has room, 1 s for a full
 * `maxConcurrent` (the account cannot know when a request will end), and nothing for a
 * request larger than the whole token budget, which can never be admitted.
 */
export class ProviderAccount {
  readonly #maxConcurrent: number | undefined;
  readonly #requests: Bucket | undefined;
  readonly #tokens: Bucket | undefined;
  readonly #clock: { now(): number };
  #active = 0;
  #rateLimited = 0;

  constructor(limits: StandInLimits, clock: { now(): number }) {
    this.#maxConcurrent = checkLimit(limits, 'maxConcurrent', true);
    const rpm = checkLimit(limits, 'requestsPerMinute', false);
    const tpm = checkLimit(limits, 'tokensPerMinute', false);
    this.#clock = clock;
    const now = clock.now();
    this.#requests = rpm === undefined ? undefined : new Bucket(rpm, now);
    this.#tokens = tpm === undefined ? undefined : new Bucket(tpm, now);
  }

  /** Requests answered 429 because a limit was reached. */
  get rateLimited(): number {
    return this.#rateLimited;
  }

  /** Admits a request that needs `tokens` (prompt plus output cap), or refuses it. */
  admit(tokens: number): Admission | Refusal {
    const now = this.#clock.now();
    const refusal = this.#refusal(tokens, now);
    if (refusal) {
      this.#rateLimited++;
      return refusal;
    }
    this.#active++;
    this.#requests?.take(1, now);
    this.#tokens?.take(tokens, now);
    return { tokens };
  }

  /** The response of an admitted request ended; `used` is the usage it reported, if it completed. */
  finish(admission: Admission, used: number | undefined): void {
    this.#active--;
    if (used !== undefined) this.#tokens?.take(used - admission.tokens, this.#clock.now());
  }

  /** The per-minute budgets as they stand, for the rate-limit headers. */
  windows(): { requests?: WindowFigures; tokens?: WindowFigures; now: number } {
    const now = this.#clock.now();
    const figures = (bucket: Bucket): WindowFigures => ({
      limit: bucket.capacity,
      remaining: Math.max(0, Math.floor(bucket.level(now))),
      resetMs: bucket.fullInMs(now),
    });
    return {
      now,
      ...(this.#requests ? { requests: figures(this.#requests) } : {}),
      ...(this.#tokens ? { tokens: figures(this.#tokens) } : {}),
    };
  }

  #refusal(tokens: number, now: number): Refusal | undefined {
    if (this.#maxConcurrent !== undefined && this.#active >= this.#maxConcurrent) {
      return {
        limit: 'concurrent',
        retryAfterMs: 1_000,
        message: `Rate limit reached: at most ${this.#maxConcurrent} requests at once`,
      };
    }
    const requestsWait = this.#requests?.waitMs(1, now) ?? 0;
    if (requestsWait > 0) {
      return {
        limit: 'requests',
        retryAfterMs: requestsWait,
        message: `Rate limit reached for requests per min: limit ${this.#requests!.capacity}, requested 1`,
      };
    }
    if (!this.#tokens) return undefined;
    if (tokens > this.#tokens.capacity) {
      return {
        limit: 'tokens',
        retryAfterMs: undefined,
        message: `Request too large for tokens per min: limit ${this.#tokens.capacity}, requested ${tokens}`,
      };
    }
    const tokensWait = this.#tokens.waitMs(tokens, now);
    if (tokensWait === 0) return undefined;
    return {
      limit: 'tokens',
      retryAfterMs: tokensWait,
      message: `Rate limit reached for tokens per min: limit ${this.#tokens.capacity}, requested ${tokens}`,
    };
  }
}

export function isRefusal(outcome: Admission | Refusal): outcome is Refusal {
  return 'limit' in outcome;
}

function checkLimit(limits: StandInLimits, field: keyof StandInLimits, integer: boolean): number | undefined {
  const value = limits[field];
  if (value === undefined) return undefined;
  const ok =
    typeof value === 'number' && Number.isFinite(value) && value > 0 && (!integer || Number.isInteger(value));
  if (!ok) {
    throw new TypeError(
      `Expected \`limits.${field}\` to be a positive ${integer ? 'integer' : 'number'}, got \`${String(value)}\``,
    );
  }
  return value;
}
