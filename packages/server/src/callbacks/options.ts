import type { Database } from '@sluice/postgres/database';
import { MINUTE, SECOND, type Clock } from 'sluice/concurrency';
import type { Resolver } from './destination.js';

const HOUR = 60 * MINUTE;

/** What the dispatcher reports, for logs and for tests that wait on a step. */
export type DispatcherEvent =
  | { type: 'claimed'; ids: string[] }
  | { type: 'delivered'; id: string; runId: string; attempts: number; status: number }
  | {
      type: 'retry';
      id: string;
      runId: string;
      attempts: number;
      reason: string;
      status: number | null;
      delayMs: number;
    }
  | { type: 'failed'; id: string; runId: string; attempts: number; reason: string; status: number | null }
  | { type: 'dead'; id: string; runId: string; attempts: number; reason: string; status: number | null }
  /** `stop()` cut an attempt short; the row is delivered after its lease ends, by any process. */
  | { type: 'abandoned'; id: string; runId: string }
  /** A poll ended; the next one is at most `nextPollMs` away (sooner on `notify()` or a free slot). */
  | { type: 'idle'; inFlight: number; nextPollMs: number }
  | { type: 'error'; during: 'poll' | 'record'; error: unknown };

export interface CallbackDispatcherOptions {
  db: Database;
  /** The body of the callback: the run as the API shows it; undefined when it is gone. */
  renderRun(runId: string, tenant: string): Promise<object | undefined>;
  /** SLUICE_CALLBACK_ALLOW_PRIVATE=1: deliver to loopback and private addresses too. @default false */
  allowPrivate?: boolean;
  /** Deliveries in flight at once in this process. @default 8 */
  concurrency?: number;
  /** One attempt, from connecting to the response headers. @default 10000 */
  attemptTimeoutMs?: number;
  /** A delivery still failing this long after its run ended is given up (`dead`). @default 86400000 (24 h) */
  maxAgeMs?: number;
  /** Longest time between looks at the table (other processes' rows, due retries). @default 1000 */
  pollIntervalMs?: number;
  /** The next poll after one that failed (the database away): never later than pollIntervalMs. @default 1000 */
  pollRetryMs?: number;
  /**
   * How long a claimed row stays with this process. Another process delivers it after that,
   * so it must outlast an attempt. @default attemptTimeoutMs + 30000
   */
  leaseMs?: number;
  /** How long `stop()` waits for attempts in flight before it abandons them. @default 5000 */
  stopTimeoutMs?: number;
  /** First retry delay; doubled per attempt, with jitter down to half. @default 5000 */
  retryBaseMs?: number;
  /** Longest retry delay. @default 3600000 (1 h) */
  retryMaxMs?: number;
  /** A receiver's Retry-After is honoured up to this. @default 3600000 (1 h) */
  maxRetryAfterMs?: number;
  /**
   * Time source for timers, backoff, leases and the webhook timestamp. Without it the SQL uses
   * the database's clock, so processes on hosts with skewed clocks agree on leases.
   * @default the system clock, with the database's clock in SQL
   */
  clock?: Clock;
  /** Jitter source in [0, 1). @default Math.random */
  random?: () => number;
  /** Name resolution at connect time (tests). @default dns.lookup */
  lookup?: Resolver;
  log?(event: DispatcherEvent): void;
}

export const dispatcherDefaults = Object.freeze({
  allowPrivate: false,
  concurrency: 8,
  attemptTimeoutMs: 10 * SECOND,
  maxAgeMs: 24 * HOUR,
  pollIntervalMs: 1 * SECOND,
  pollRetryMs: 1 * SECOND,
  leaseMarginMs: 30 * SECOND,
  stopTimeoutMs: 5 * SECOND,
  retryBaseMs: 5 * SECOND,
  retryMaxMs: 1 * HOUR,
  maxRetryAfterMs: 1 * HOUR,
});

export interface ResolvedDispatcherOptions {
  readonly db: Database;
  readonly renderRun: CallbackDispatcherOptions['renderRun'];
  readonly allowPrivate: boolean;
  readonly concurrency: number;
  readonly attemptTimeoutMs: number;
  readonly maxAgeMs: number;
  readonly pollIntervalMs: number;
  readonly pollRetryMs: number;
  readonly leaseMs: number;
  readonly stopTimeoutMs: number;
  readonly retryBaseMs: number;
  readonly retryMaxMs: number;
  readonly maxRetryAfterMs: number;
  /** Undefined: the system clock in the process and the database's clock in SQL. */
  readonly clock: Clock | undefined;
  readonly random: () => number;
  readonly lookup: Resolver | undefined;
  readonly log: (event: DispatcherEvent) => void;
}

/** Validates every option, against each other too, and fills in the defaults. */
export function resolveDispatcherOptions(options: CallbackDispatcherOptions): ResolvedDispatcherOptions {
  if (typeof options !== 'object' || options === null) {
    throw new TypeError(`Expected the dispatcher options to be an object, got \`${String(options)}\``);
  }
  if (typeof options.db?.query !== 'function' || typeof options.db.transaction !== 'function') {
    throw new TypeError('Expected `db` to be a Database from @sluice/postgres/database');
  }
  if (typeof options.renderRun !== 'function') {
    throw new TypeError(`Expected \`renderRun\` to be a function, got \`${typeof options.renderRun}\``);
  }
  const allowPrivate = options.allowPrivate ?? dispatcherDefaults.allowPrivate;
  if (typeof allowPrivate !== 'boolean') {
    throw new TypeError(`Expected \`allowPrivate\` to be a boolean, got \`${String(allowPrivate)}\``);
  }
  const whole = (name: keyof typeof options, value: unknown, min: number): number => {
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
      throw new RangeError(`Expected \`${name}\` to be a whole number >= ${min}, got \`${String(value)}\``);
    }
    return value;
  };
  const d = dispatcherDefaults;
  const attemptTimeoutMs = whole('attemptTimeoutMs', options.attemptTimeoutMs ?? d.attemptTimeoutMs, 1);
  const leaseMs = whole('leaseMs', options.leaseMs ?? attemptTimeoutMs + d.leaseMarginMs, 1);
  if (leaseMs <= attemptTimeoutMs) {
    throw new RangeError(
      `Expected \`leaseMs\` (${leaseMs}) to be longer than \`attemptTimeoutMs\` (${attemptTimeoutMs}): a lease that ends mid-attempt sends the callback twice`,
    );
  }
  const retryBaseMs = whole('retryBaseMs', options.retryBaseMs ?? d.retryBaseMs, 1);
  const retryMaxMs = whole('retryMaxMs', options.retryMaxMs ?? d.retryMaxMs, 1);
  if (retryMaxMs < retryBaseMs) {
    throw new RangeError(
      `Expected \`retryMaxMs\` (${retryMaxMs}) to be at least \`retryBaseMs\` (${retryBaseMs})`,
    );
  }
  for (const name of ['random', 'log', 'lookup'] as const) {
    if (options[name] !== undefined && typeof options[name] !== 'function') {
      throw new TypeError(`Expected \`${name}\` to be a function, got \`${typeof options[name]}\``);
    }
  }
  const pollIntervalMs = whole('pollIntervalMs', options.pollIntervalMs ?? d.pollIntervalMs, 1);
  return Object.freeze({
    db: options.db,
    renderRun: options.renderRun,
    allowPrivate,
    concurrency: whole('concurrency', options.concurrency ?? d.concurrency, 1),
    attemptTimeoutMs,
    maxAgeMs: whole('maxAgeMs', options.maxAgeMs ?? d.maxAgeMs, 1),
    pollIntervalMs,
    pollRetryMs: Math.min(pollIntervalMs, whole('pollRetryMs', options.pollRetryMs ?? d.pollRetryMs, 1)),
    leaseMs,
    stopTimeoutMs: whole('stopTimeoutMs', options.stopTimeoutMs ?? d.stopTimeoutMs, 0),
    retryBaseMs,
    retryMaxMs,
    maxRetryAfterMs: whole('maxRetryAfterMs', options.maxRetryAfterMs ?? d.maxRetryAfterMs, 0),
    clock: options.clock,
    random: options.random ?? Math.random,
    lookup: options.lookup,
    log: options.log ?? (() => undefined),
  });
}
