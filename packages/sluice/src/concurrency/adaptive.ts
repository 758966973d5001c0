/**
 * The adaptive concurrency limit (DESIGN.md part 3): additive increase, multiplicative
 * decrease, on the provider's overload answers. Pure; the state lives with the budgets in
 * {@link CapacityState} (capacity.ts), so the PostgreSQL limiter stores it in one row.
 *
 * The parameters, from the anchors in the research note:
 * - decrease: `limit × 0.9`, rounded down, by at least 1. Netflix's AIMDLimit (backoffRatio
 *   0.9) and Vector's ARC (decrease_ratio 0.9) cut by a tenth; the llm-d batch gateway halves.
 *   We take 0.9: every overload answer also pauses all grants until the provider's retry
 *   time, which is what protects the account at once (the role llm-d gives its halving),
 *   so the cut only has to find the provider's real concurrency. Halving would leave the
 *   limit oscillating between C/2 and C (about 75% of the account used); 0.9 keeps it
 *   between 0.9 C and C.
 * - increase: +1 after `limit` successful releases made while the limit was in use (as many
 *   slots held as the limit): one step per full window of the limit, as llm-d's "a window of
 *   clean answers" and Netflix's AIMD (`inflight * 2 >= limit`, stricter here). Releases
 *   while the limit is not in use say nothing about it, so they do not raise it: this is what
 *   stops the upward creep of Netflix concurrency-limits#134/#137, where a limit grew under a
 *   steady load that never tested it. Nor do releases of requests granted before the latest
 *   decrease: they ran under the old limit, so the first probe above a lowered limit waits
 *   for a full window of requests sent under it. And the step back up to a limit the
 *   provider refused takes {@link RETRY_WINDOWS} windows, not one.
 * - one decrease per burst, no cooldown timer: an overload answer to a request granted before
 *   the latest decrease is ignored (it was sent under the old limit; cutting again for it
 *   would count one burst many times, the halving-to-the-floor of concurrency-limits#72). A
 *   grant is known by its number (the lease's fence in PostgreSQL). A timer would be wrong
 *   both ways: too short and one burst cuts twice, too long and a real second overload is
 *   missed; the grant numbers say exactly which answers are news.
 * Envoy's gradient controller was the other anchor: it needs latency samples and pins the
 * limit to a minimum to measure them (with the 503s its docs warn of); a provider tells us
 * its overload outright, so loss-based AIMD fits better.
 */

/** Multiplicative decrease on a provider overload answer (see the header). */
export const DECREASE_FACTOR = 0.9;

/**
 * How many windows of successes it takes to step back up to a limit the provider refused
 * (see {@link AdaptiveState.refusedAt}). Trying a refused limit again costs a 429 and a pause
 * of every caller; under a steady overload at capacity C, one window per step made about one
 * answer in ten a 429 at C = 5 (the no-creep test of adaptive.test.ts). Ten windows of
 * evidence before the retry bound it at about one 429 per 10 C successful requests, while a
 * limit the provider never refused still climbs at the full rate.
 */
export const RETRY_WINDOWS = 10;

/** The limit after an overload answer: a tenth less, at least 1 less, never below `min`. */
export function decreased(limit: number, min: number): number {
  return Math.max(min, Math.min(limit - 1, Math.floor(limit * DECREASE_FACTOR)));
}

/** Where the adaptive limit stands. */
export interface AdaptiveState {
  /** The effective limit. */
  readonly limit: number;
  /** Successful releases at the limit since it last moved. */
  readonly successes: number;
  /** Overload answers to grants numbered up to this are ignored (see the header). */
  readonly ignoreUpTo: number;
  /**
   * The lowest limit the provider refused since the limit last climbed past it: stepping up
   * to it takes {@link RETRY_WINDOWS} windows of successes. Absent: none refused.
   */
  readonly refusedAt?: number | undefined;
}

export interface AdaptiveBounds {
  readonly min: number;
  readonly max: number;
}

/** What a release says to the adaptive limit. */
export type AdaptiveSignal =
  | { readonly kind: 'overload'; readonly grant: number | undefined; readonly newestGrant: number }
  | { readonly kind: 'success'; readonly active: number; readonly grant: number | undefined }
  | { readonly kind: 'none' };

export interface AdaptiveStep {
  readonly state: AdaptiveState;
  readonly changed?: { readonly from: number; readonly to: number; readonly reason: 'overload' | 'increase' };
}

/**
 * The next state of the limit after one release.
 *
 * @example
 * adapt({ limit: 10, successes: 0, ignoreUpTo: 0 }, { min: 1, max: 16 }, { kind: 'overload', grant: 7, newestGrant: 12 })
 * // => { state: { limit: 9, successes: 0, ignoreUpTo: 12, refusedAt: 10 }, changed: { from: 10, to: 9, reason: 'overload' } }
 */
export function adapt(state: AdaptiveState, bounds: AdaptiveBounds, signal: AdaptiveSignal): AdaptiveStep {
  switch (signal.kind) {
    case 'overload': {
      // An unknown grant (a lease that had already expired) cannot be placed: ignored.
      if (signal.grant === undefined || signal.grant <= state.ignoreUpTo) return { state };
      const to = decreased(state.limit, bounds.min);
      const refusedAt = Math.min(state.limit, state.refusedAt ?? Infinity);
      const next = { limit: to, successes: 0, ignoreUpTo: signal.newestGrant, refusedAt };
      return to === state.limit
        ? { state: next }
        : { state: next, changed: { from: state.limit, to, reason: 'overload' } };
    }
    case 'success': {
      if (signal.active < state.limit || state.limit >= bounds.max) return { state };
      // Sent before the latest decrease: it says nothing about the lowered limit.
      if (signal.grant === undefined || signal.grant <= state.ignoreUpTo) return { state };
      const successes = state.successes + 1;
      const to = state.limit + 1;
      const windows = state.refusedAt !== undefined && to >= state.refusedAt ? RETRY_WINDOWS : 1;
      if (successes < state.limit * windows) return { state: { ...state, successes } };
      // Past the refused limit without a refusal: the provider's capacity has grown.
      const refusedAt = state.refusedAt !== undefined && to > state.refusedAt ? undefined : state.refusedAt;
      return {
        state: { ...state, limit: to, successes: 0, refusedAt },
        changed: { from: state.limit, to, reason: 'increase' },
      };
    }
    case 'none':
      return { state };
    default: {
      const unknown: never = signal;
      throw new Error(`unknown adaptive signal ${JSON.stringify(unknown)}`);
    }
  }
}
