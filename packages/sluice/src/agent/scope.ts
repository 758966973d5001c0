import { AsyncLocalStorage } from 'node:async_hooks';
import type { Clock } from '../concurrency/clock.js';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import { RunTimeoutError, type RunErrorFields } from './errors.js';
import { LinkedAbort, timer } from './signals.js';
import type { RunTrace } from './tracing.js';

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
  /** Who the run works for: its slot requests' fairness key (see `AcquireRequest.key`). */
  readonly key: string | undefined;
  /** The output tokens each of the run's requests is expected to use; undefined: the cap. */
  readonly outputTokens: number | undefined;
  /** Aborted when the run is cancelled or its budget runs out: requests and tools stop on it. */
  readonly signal: AbortSignal;
  /**
   * Aborted only when the run is cancelled (its caller's signal, or its parent's
   * cancellation), never by its budget. A slot wait listens to this one and is given the
   * budget as `timeoutMs`, so that `acquireSlot` alone decides when a wait has timed out.
   */
  readonly cancelSignal: AbortSignal;
  /** When the run must be over, in `clock`'s time; undefined for no budget. */
  readonly deadline: number | undefined;
  /** The run's time source: its deadline, timeouts and retry waits. */
  readonly clock: Clock;
  /** Every listener up the tree: a parent hears its children's concurrency events. */
  readonly listeners: readonly ConcurrencyEventListener[];
  /** The run's spans: its requests and tool calls hang under its open turn. */
  readonly trace: RunTrace;
}

export const runScope = new AsyncLocalStorage<RunScope>();

/** The error fields of a run (and of the provider request, when given). */
export function runFields(scope: RunScope, requestId?: string): RunErrorFields {
  return {
    limiter: scope.limiter?.name ?? 'none',
    workload: scope.workload,
    runId: scope.runId,
    rootRunId: scope.rootRunId,
    parentRunId: scope.parentRunId,
    requestId,
  };
}

export interface ScopeInit {
  readonly runId: string;
  readonly parent: RunScope | undefined;
  readonly limiter: ConcurrencyLimiter<string> | undefined;
  readonly workload: string | undefined;
  readonly key: string | undefined;
  readonly outputTokens: number | undefined;
  readonly clock: Clock;
  readonly timeoutMs: number | undefined;
  readonly signal: AbortSignal | undefined;
  readonly listeners: readonly ConcurrencyEventListener[];
  readonly trace: RunTrace;
}

/**
 * Opens a run's scope: links its cancellation to its caller's and its parent's, and arms its
 * budget. A child gets what is left of its parent's budget, measured on the parent's clock,
 * so a tree whose agents keep different clocks still agrees on the time left. `close()`
 * clears the timer and detaches every listener.
 */
export function openScope(init: ScopeInit): { scope: RunScope; close(): void } {
  const { parent, clock } = init;
  const startedAt = clock.now();
  const parentLeft = parent?.deadline === undefined ? undefined : parent.deadline - parent.clock.now();
  const budget =
    init.timeoutMs === undefined
      ? parentLeft
      : parentLeft === undefined
        ? init.timeoutMs
        : Math.min(init.timeoutMs, parentLeft);
  const deadline = budget === undefined ? undefined : startedAt + budget;

  const cancel = new LinkedAbort([init.signal, parent?.cancelSignal]);
  // The parent's budget ends this run too (the child's own deadline is no later anyway).
  const whole = new LinkedAbort([cancel.signal, parent?.signal]);
  const scope: RunScope = {
    runId: init.runId,
    rootRunId: parent?.rootRunId ?? init.runId,
    parentRunId: parent?.runId,
    limiter: init.limiter,
    workload: init.workload,
    key: init.key,
    outputTokens: init.outputTokens,
    signal: whole.signal,
    cancelSignal: cancel.signal,
    deadline,
    clock,
    listeners: [...(parent?.listeners ?? []), ...init.listeners],
    trace: init.trace,
  };
  const budgetTimer = timer(clock, budget === undefined ? undefined : Math.max(0, budget), () =>
    whole.abort(new RunTimeoutError({ ...runFields(scope), timeoutMs: budget! })),
  );
  return {
    scope,
    close() {
      budgetTimer.clear();
      cancel.dispose();
      whole.dispose();
    },
  };
}
