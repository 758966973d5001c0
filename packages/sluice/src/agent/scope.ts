import { AsyncLocalStorage } from 'node:async_hooks';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';

/**
 * What a run passes to the runs its tools start: its identity, its limiter and workload,
 * its cancellation and what is left of its time budget. Carried by AsyncLocalStorage, so a
 * tool that calls another agent's `run()` makes that run a child without passing anything.
 */
export interface RunScope {
  readonly runId: string;
  readonly rootRunId: string;
  readonly parentRunId: string | undefined;
  readonly limiter: ConcurrencyLimiter<string> | undefined;
  readonly workload: string | undefined;
  readonly signal: AbortSignal;
  /** Epoch ms by which the run must be over; undefined for no budget. */
  readonly deadline: number | undefined;
  /** Every listener up the tree: a parent hears its children's concurrency events. */
  readonly listeners: readonly ConcurrencyEventListener[];
}

export const runScope = new AsyncLocalStorage<RunScope>();
