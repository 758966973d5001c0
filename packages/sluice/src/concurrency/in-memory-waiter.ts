import type { TokenCost } from './budgets.js';
import type { ClockTimer } from './clock.js';
import type { FairNode } from './fair-queue.js';
import type { AcquireRequest, ConcurrencyLease } from './limiter.js';
import type { ResolvedWorkload } from './options.js';

/** A request in the queue. It carries its own list links, so removal is O(1). */
export interface Waiter<W extends string> extends FairNode<Waiter<W>> {
  readonly seq: number;
  /** Set once the request may wait: a request tried at once has none yet. */
  deadline: number | undefined;
  readonly tokens: TokenCost;
  readonly workload: ResolvedWorkload<W>;
  readonly request: AcquireRequest<W>;
  readonly enqueuedAt: number | undefined;
  readonly timeoutMs: number | undefined;
  timer: ClockTimer | undefined;
  /** The signal it is watched on (the request's, as it was when it asked). */
  signal: AbortSignal | undefined;
  resolve(lease: ConcurrencyLease<W>): void;
  reject(error: unknown): void;
}
