/**
 * What every limiter does in front of the allocation rules, written once so that the
 * built-in limiters (and yours) agree on every edge case, not only on grants:
 *
 * - {@link prepareAcquire}: the checks a request meets before it may wait (its workload, an
 *   already aborted signal, a spent budget) and the wait it is allowed;
 * - {@link limiterErrors}: the errors a limiter rejects with, with their numbers and lineage;
 * - {@link statsOf}: `stats()` from per-workload counts.
 */
import {
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
    }
  | { readonly ok: false; readonly error: unknown };

/**
 * Checks a request before it may wait, in this order: its workload (unknown: the
 * `ConcurrencyConfigError`, with the request's lineage), its key (not a string of 1 to
 * `MAX_KEY_LENGTH` characters: the same error, `field: 'key'`), its signal (already aborted: its
 * reason), its budget (0 or less: `ConcurrencyTimeoutError` with `waitMs: 0`). A request that
 * passes gets its workload and the wait it is allowed.
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
  try {
    workload = resolveWorkload(limits, request.workload, request);
    key = resolveKey(limits, request.key, workload.name, request);
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
  return { ok: true, workload, key, timeoutMs };
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
): ConcurrencyStats<W> {
  const workloads = {} as Record<W, WorkloadStats>;
  let active = 0;
  let queued = 0;
  for (const w of limits.workloads) {
    const a = counts.active[w.index] ?? 0;
    const q = counts.queued[w.index] ?? 0;
    active += a;
    queued += q;
    workloads[w.name] = { active: a, queued: q };
  }
  return { active, queued, workloads };
}
