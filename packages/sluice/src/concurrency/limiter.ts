import type { BudgetsStats, ReleaseDetails, TokenCounts } from './capacity-types.js';
import type { RequestLineage } from './errors.js';
import type { ConcurrencyEventListener } from './events.js';

/** What a caller asks a limiter for: one slot, for one provider request. */
export interface AcquireRequest<W extends string = string> extends RequestLineage {
  /** Workload to count the slot against; the limiter's default when absent. */
  readonly workload?: W | undefined;
  /**
   * Who the request is for (a tenant, a user): among the requests waiting in one workload, the
   * keys take turns, each key's own requests first in, first out. Requests without a key
   * share one implicit key. 1 to 256 characters.
   */
  readonly key?: string | undefined;
  /** Cancels the wait. The acquire then rejects with `signal.reason`. */
  readonly signal?: AbortSignal | undefined;
  /**
   * What is left of the caller's time budget. The wait ends at the smaller of this and the
   * workload's `maxWaitMs`, with `ConcurrencyTimeoutError`. A budget of 0 or less fails at once.
   */
  readonly timeoutMs?: number | undefined;
  /**
   * The request's estimated tokens, charged to the token budgets at the grant and settled at
   * release. Absent: 0 tokens.
   */
  readonly tokens?: TokenCounts | undefined;
}

/**
 * A granted slot. It stays valid until `expiresAt` unless renewed; after that the limiter may
 * give the slot to someone else.
 */
export interface ConcurrencyLease<W extends string = string> {
  /** Unique for all time: a lease id is never handed out twice. */
  readonly id: string;
  readonly limiter: string;
  readonly workload: W;
  /** When the slot was granted, in the limiter's clock. */
  readonly acquiredAt: number;
  /** When the slot lapses without renewal, in the limiter's clock. */
  readonly expiresAt: number;
  /**
   * Monotonic number of the grant, for fencing at a provider or a store that checks it.
   * Limiters backed by shared storage set it.
   */
  readonly fence?: number | undefined;
}

export interface WorkloadStats {
  /** Slots in use. */
  readonly active: number;
  /** Requests waiting for a slot. */
  readonly queued: number;
}

export interface ConcurrencyStats<W extends string = string> {
  readonly active: number;
  readonly queued: number;
  /** The effective concurrency limit (`maxConcurrent` unless `adaptive` lowered it). */
  readonly limit?: number;
  /** Each configured budget's state. */
  readonly budgets?: BudgetsStats;
  readonly workloads: { readonly [K in W]: WorkloadStats };
}

/**
 * What any limiter implements; the in-memory and PostgreSQL limiters do, and so can your own.
 * Sluice owns the slot lifecycle (renewal, release, cancellation); the limiter owns
 * allocation, queue order and storage. A limiter must:
 * - allocate atomically (never more valid leases than the limits allow);
 * - hand out leases that expire unless renewed;
 * - make `renew` and `release` idempotent;
 * - never reuse a lease id;
 * - make `acquire` safe to cancel: when it rejects, nothing stays held or queued.
 *
 * `concurrencyConformanceCases` checks all of this against a limiter of yours.
 */
export interface ConcurrencyLimiter<W extends string = string> {
  readonly name: string;
  /** Waits for a slot and resolves with its lease. */
  acquire(request?: AcquireRequest<W>): Promise<ConcurrencyLease<W>>;
  /**
   * Extends a lease. Resolves the renewed lease, or `undefined` when the limiter no longer
   * holds it (expired, released). Rejects only for transient failures.
   */
  renew(lease: ConcurrencyLease<W>): Promise<ConcurrencyLease<W> | undefined>;
  /**
   * Gives the slot back. Releasing a lease twice, or an expired one, is harmless. `details`
   * (optional: a limiter may ignore it) settles the grant's tokens to the usage and reports
   * the provider's status and rate-limit figures.
   */
  release(lease: ConcurrencyLease<W>, details?: ReleaseDetails): Promise<void>;
  /**
   * Resolves the workload a request would use (the given one or the default), or throws
   * `ConcurrencyConfigError`. Lets callers check a workload before any request is sent.
   */
  validateWorkload?(workload?: string): W;
  /**
   * The longest a request of `workload` (or the default) may wait for a slot: its `maxWaitMs`,
   * undefined for none. Lets the caller tell, before the wait starts, when it will end.
   */
  maxWaitMs?(workload?: string): number | undefined;
  /** Active and queued counts, in total and per workload. */
  stats?(): ConcurrencyStats<W> | Promise<ConcurrencyStats<W>>;
  /**
   * Hears the limiter's own events (`provider-throttled`, `limit-changed`), whoever caused
   * them. Returns the function that stops listening.
   */
  subscribe?(listener: ConcurrencyEventListener): () => void;
}
