/**
 * What every limiter does in front of the allocation rules, written once so that the
 * built-in limiters (and yours) agree on every edge case, not only on grants:
 *
 * - {@link prepareAcquire}: the checks a request meets before it may wait (its workload, an
 *   already aborted signal, a spent budget) and the wait it is allowed;
 * - {@link limiterErrors}: the errors a limiter rejects with, with their numbers and lineage;
 * - {@link statsOf}: `stats()` from per-workload counts.
 */
import { BUDGET_OPTIONS, budgetsOf, costIn, NO_TOKENS, type TokenCost } from './budgets.js';
import type { BudgetsStats } from './capacity-types.js';
import {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  lineageOf,
  type RequestLineage,
} from './errors.js';
import type { AcquireRequest, ConcurrencyStats, WorkloadStats } from './limiter.js';
import { resolveKey, resolveWorkload, type ResolvedLimits, type ResolvedWorkload } from './options.js';

/** A request that may wait, or the error it must be rejected with at once. */
export type PreparedAcquire<W extends string = string> =
  | {
      readonly ok: true;
      readonly workload: ResolvedWorkload<W>;
      /** The request's fairness key; `IMPLICIT_KEY` when it gave none. */
      readonly key: string;
      /** The wait allowed: the smaller of the workload's `maxWaitMs` and the caller's budget. */
      readonly timeoutMs: number | undefined;
      /** The request's tokens, both parts present (absent ones are 0). */
      readonly tokens: TokenCost;
    }
  | { readonly ok: false; readonly error: unknown };

/**
 * Checks a request before it may wait, in this order: its workload (unknown: the
 * `ConcurrencyConfigError`, with the request's lineage), its key (not a string of 1 to
 * `MAX_KEY_LENGTH` characters: the same error, `field: 'key'`), its tokens (not finite numbers
 * >= 0, or more than a budget's whole figure, so that it could never be granted: the same
 * error), its signal (already aborted: its reason), its budget (0 or less:
 * `ConcurrencyTimeoutError` with `waitMs: 0`). A request that passes gets its workload, its
 * tokens and the wait it is allowed.
 *
 * @example
 * const prepared = prepareAcquire(this.limits, request);
 * if (!prepared.ok) return Promise.reject(prepared.error);
 * // wait at most prepared.timeoutMs for a slot of prepared.workload
 */
export function prepareAcquire<W extends string>(
  limits: ResolvedLimits<W>,
  request: AcquireRequest<W>,
): PreparedAcquire<W> {
  let workload: ResolvedWorkload<W>;
  let key: string;
  let tokens: TokenCost;
  try {
    workload = resolveWorkload(limits, request.workload, request);
    key = resolveKey(limits, request.key, workload.name, request);
    tokens = resolveTokens(limits, request.tokens, workload.name, request);
  } catch (error) {
    return { ok: false, error };
  }
  if (request.signal?.aborted) return { ok: false, error: request.signal.reason };
  const budget = request.timeoutMs;
  if (budget !== undefined && budget <= 0) {
    return {
      ok: false,
      error: limiterErrors(limits).timeout(workload.name, request, 0, Math.max(0, budget)),
    };
  }
  const maxWaitMs = workload.maxWaitMs;
  const timeoutMs =
    maxWaitMs === undefined ? budget : budget === undefined ? maxWaitMs : Math.min(maxWaitMs, budget);
  return { ok: true, workload, key, timeoutMs, tokens };
}

/**
 * A request's tokens: absent parts are 0, present ones finite numbers >= 0, and the request
 * must fit each budget's whole figure (a bucket never holds more), else it could wait for ever.
 */
export function resolveTokens(
  limits: Pick<ResolvedLimits, 'name' | 'rate'>,
  tokens: unknown,
  workload: string,
  lineage: RequestLineage = {},
): TokenCost {
  if (tokens === undefined) return NO_TOKENS;
  const refuse = (message: string, field: string, value: unknown): never => {
    throw new ConcurrencyConfigError(message, {
      limiter: limits.name,
      workload,
      ...lineageOf(lineage),
      field,
      value,
    });
  };
  if (typeof tokens !== 'object' || tokens === null || Array.isArray(tokens)) {
    refuse(
      `Expected \`tokens\` to be an object { input, output }, got \`${String(tokens)}\``,
      'tokens',
      tokens,
    );
  }
  const part = (name: 'input' | 'output'): number => {
    const value = (tokens as Record<string, unknown>)[name];
    if (value === undefined) return 0;
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
      refuse(
        `Expected \`tokens.${name}\` to be a finite number >= 0, got \`${String(value)}\``,
        `tokens.${name}`,
        value,
      );
    }
    return value as number;
  };
  const cost = { input: part('input'), output: part('output') };
  // Two finite parts can still sum to Infinity (1e308 each). Such a charge settled against
  // itself is Infinity - Infinity: a bucket level of NaN, on which every later wait for a
  // refill searched for ever, blocking the process.
  if (!Number.isFinite(cost.input + cost.output)) {
    refuse(
      `Expected \`tokens.input + tokens.output\` to be a finite number, got \`${cost.input} + ${cost.output}\``,
      'tokens',
      tokens,
    );
  }
  // Configured budgets only: a request larger than a budget learned from the provider's
  // headers goes once that bucket is full (learned.ts says why).
  const figures = limits.rate ?? {};
  for (const budget of budgetsOf(figures)) {
    const figure = figures[budget]!;
    const needs = costIn(budget, cost);
    if (needs > figure) {
      refuse(
        `Request of ${needs} tokens can never be granted by limiter \`${limits.name}\`: budget \`${budget}\` (\`${BUDGET_OPTIONS[budget]}\`) is ${figure} per minute`,
        `tokens`,
        needs,
      );
    }
  }
  return cost;
}

/** The errors of one limiter. */
export interface LimiterErrors {
  /** No slot within `timeoutMs`; the request waited `waitMs`. */
  timeout(
    workload: string,
    request: RequestLineage,
    waitMs: number,
    timeoutMs: number,
  ): ConcurrencyTimeoutError;
  /** The queue held `queued` requests, as many as `maxQueued` allows. */
  queueFull(workload: string, request: RequestLineage, queued: number): ConcurrencyQueueFullError;
  /**
   * The limiter itself failed (its storage, say): anything that is not already a
   * `ConcurrencyError` becomes a `ConcurrencyLimiterError` with the failure as its `cause`.
   */
  failure(error: unknown, workload: string | undefined, request: RequestLineage): ConcurrencyError;
}

/**
 * The errors a limiter rejects with, with the limiter's name, the workload, the request's
 * lineage and the numbers in each message.
 *
 * @example
 * const errors = limiterErrors(this.limits);
 * reject(errors.timeout(workload, request, waitedMs, timeoutMs));
 */
export function limiterErrors(limits: {
  readonly name: string;
  readonly maxQueued?: number | undefined;
}): LimiterErrors {
  const limiter = limits.name;
  return {
    timeout: (workload, request, waitMs, timeoutMs) =>
      new ConcurrencyTimeoutError({ limiter, workload, ...lineageOf(request), waitMs, timeoutMs }),
    queueFull: (workload, request, queued) =>
      new ConcurrencyQueueFullError({
        limiter,
        workload,
        ...lineageOf(request),
        maxQueued: limits.maxQueued ?? 0,
        queued,
      }),
    failure: (error, workload, request) => {
      if (error instanceof ConcurrencyError) return error;
      const message = error instanceof Error ? error.message : String(error);
      return new ConcurrencyLimiterError(`Limiter \`${limiter}\` failed: ${message}`, {
        limiter,
        workload,
        ...lineageOf(request),
        cause: error,
      });
    },
  };
}

/** Slots in use and requests waiting per workload, indexed like `limits.workloads`. */
export interface WorkloadCounts {
  readonly active: readonly number[];
  readonly queued: readonly number[];
}

/**
 * `stats()` from per-workload counts: the totals, and every workload of the limits (a
 * workload with no count is 0).
 *
 * @example
 * statsOf(limits, { active: [2, 5], queued: [0, 3] })
 * // => { active: 7, queued: 3, workloads: { interactive: { active: 2, queued: 0 }, background: { active: 5, queued: 3 } } }
 */
export function statsOf<W extends string>(
  limits: ResolvedLimits<W>,
  counts: WorkloadCounts,
  capacity?: { readonly limit: number; readonly budgets: BudgetsStats | undefined },
): ConcurrencyStats<W> {
  let active = 0;
  let queued = 0;
  const entries = limits.workloads.map((w): [W, WorkloadStats] => {
    const a = counts.active[w.index] ?? 0;
    const q = counts.queued[w.index] ?? 0;
    active += a;
    queued += q;
    return [w.name, { active: a, queued: q }];
  });
  // Built as own properties: assigning `workloads['__proto__']` would set the prototype instead,
  // and the workload of that name would vanish from the stats.
  const workloads = Object.fromEntries(entries) as Record<W, WorkloadStats>;
  if (capacity === undefined) return { active, queued, workloads };
  const { limit, budgets } = capacity;
  return budgets === undefined
    ? { active, queued, limit, workloads }
    : { active, queued, limit, budgets, workloads };
}
