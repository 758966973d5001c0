import type { AcquireRequest, ClockTimer, ConcurrencyLease } from 'sluice/concurrency';

/**
 * A request of this process waiting for a slot of the PostgreSQL limiter.
 *
 *   starting --ready, queue entry added--> waiting
 *   waiting --granted here, or offer claimed--> done (resolved)
 *   waiting --offer announced--> claiming --claimed--> done | --offer gone--> waiting (enqueued again)
 *   waiting --aborted or deadline--> leaving --queue entry and any offer removed--> done (rejected)
 *   starting | claiming --aborted or deadline--> (noted in `end`; settled when the step returns)
 *   any --database unanswered for outageGraceMs, or close()--> done (rejected)
 */
export interface LocalWaiter {
  readonly id: string;
  readonly workload: string;
  readonly request: AcquireRequest<string>;
  /** When the request arrived, on the limiter's clock: its deadline counts from here. */
  readonly startedAt: number;
  /** The wait allowed: the smaller of maxWaitMs and the caller's budget. */
  readonly timeoutMs: number | undefined;
  state: 'starting' | 'waiting' | 'claiming' | 'leaving' | 'done';
  /** The enqueue pass in flight; leaving waits for it, so no queue entry is left behind. */
  enqueued: Promise<unknown> | undefined;
  /** Why the request ends, once cancellation or the deadline has come. */
  end: WaitEnd | undefined;
  timer: ClockTimer | undefined;
  onAbort: (() => void) | undefined;
  resolve(lease: ConcurrencyLease<string>): void;
  reject(error: unknown): void;
}

/** The caller gave up (`signal.reason`), or the deadline came (a timeout error). */
export interface WaitEnd {
  readonly error: unknown;
  readonly deadline: boolean;
}
