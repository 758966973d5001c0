/**
 * A limiter's capacity beside its slots, as one value: the budgets' levels, the provider's
 * pause and the adaptive limit (DESIGN.md part 3). `allocate` reads it to grant;
 * {@link settleRelease} is what a release does to it. Pure, so the in-memory limiter keeps it
 * in a field and the PostgreSQL limiter in its row, and both change it by the same rules.
 *
 * The pause: a 429, 503 or 529, or a rate-limit window with `remaining: 0`, stops every new
 * grant until `retryAfterMs` (the feedback's, else its `limits.retryAfterMs`), else the
 * latest reset of the exhausted windows, else 1 s. A pause is capped at one minute
 * ({@link MAX_PAUSE_MS}).
 */
import { adapt, type AdaptiveSignal, type AdaptiveState } from './adaptive.js';
import type { AllocationCapacity } from './allocate.js';
import {
  adjust,
  BUDGET_NAMES,
  budgetsOf,
  costIn,
  levelAt,
  refill,
  type BucketLevels,
  type BudgetFigures,
  type TokenCost,
} from './budgets.js';
import type { ProviderFeedback, RateLimitWindow, ReleaseDetails, TokenCounts } from './capacity-types.js';
import { SECOND, MINUTE } from './clock.js';
import { budgetFigures, learn } from './learned.js';

/** Everything a limiter keeps of its capacity. */
export interface CapacityState extends AllocationCapacity, AdaptiveState {}

/** What settling reads of the limits. `ResolvedLimits` satisfies it. */
export interface CapacityLimits {
  readonly maxConcurrent: number;
  readonly rate?: BudgetFigures | undefined;
  readonly adaptive?: { readonly minConcurrent: number } | undefined;
}

/** Statuses that mean the provider is overloaded: pause, and lower the adaptive limit. */
export const OVERLOAD_STATUSES: ReadonlySet<number> = new Set([429, 503, 529]);

/** The pause when the provider says neither when to retry nor when its window resets. */
export const DEFAULT_PAUSE_MS = 1 * SECOND;

/**
 * The longest pause one answer can cause. Budgets are per minute, so any window they model
 * is full again within a minute; a longer `retry-after` is a daily quota or a broken header
 * (1e12 ms is 31 years), and obeying it would stop every caller of the limiter, in every
 * process, with no way back but a restart. A provider that still refuses after a minute
 * pauses the limiter again with its next answer.
 */
export const MAX_PAUSE_MS = 1 * MINUTE;

/** A fresh limiter: budgets full, no pause, the limit at `maxConcurrent`. */
export function initialCapacity(limits: CapacityLimits): CapacityState {
  return { buckets: {}, pausedUntil: 0, limit: limits.maxConcurrent, successes: 0, ignoreUpTo: 0 };
}

/**
 * The state brought to `now`, before any decision: each bucket's refill added (which also
 * restarts the refill from `now` after the clock stepped back), and a pause that a backward
 * step would stretch past {@link MAX_PAUSE_MS} cut to it; a pause that is over is dropped.
 */
export function capacityAt(limits: CapacityLimits, state: CapacityState, now: number): CapacityState {
  // The common case costs nothing: slots only, no pause.
  if (limits.rate === undefined && state.learned === undefined && state.pausedUntil === 0) return state;
  const buckets = refill(budgetFigures(limits.rate, state.learned), state.buckets, now);
  const pausedUntil = state.pausedUntil <= now ? 0 : Math.min(state.pausedUntil, now + MAX_PAUSE_MS);
  return { ...state, buckets, pausedUntil };
}

/** What a release tells the capacity. */
export interface ReleaseFacts {
  readonly now: number;
  /** The grant's charge; absent when the lease is no longer known (expired, released). */
  readonly charged: TokenCost | undefined;
  /** The grant's number (its fence in PostgreSQL); absent when unknown. */
  readonly grant: number | undefined;
  /** The newest grant number so far. */
  readonly newestGrant: number;
  /** Slots in use when the release came, the released one included. */
  readonly active: number;
  readonly details: ReleaseDetails | undefined;
}

export interface ReleaseEffect {
  readonly state: CapacityState;
  /** Set when the release paused the limiter (event `provider-throttled`). */
  readonly throttled?: { readonly status: number | undefined; readonly retryAfterMs: number };
  /** Set when the adaptive limit moved (event `limit-changed`). */
  readonly limitChanged?: {
    readonly from: number;
    readonly to: number;
    readonly reason: 'overload' | 'increase';
  };
}

/**
 * The capacity after one release: with `adaptive`, the budgets the provider's headers state
 * learned (learned.ts); the grant settled to its usage, the buckets lowered to the provider's
 * `remaining`, the pause, and the adaptive limit's step. Numbers that are not finite and
 * >= 0 are ignored, field by field: feedback never throws.
 *
 * @example
 * settleRelease(limits, state, { now, charged: { input: 1200, output: 800 }, grant: 3, newestGrant: 9, active: 4,
 *   details: { usage: { input: 950, output: 312 }, provider: { status: 200 } } })
 * // => { state: { ...state, buckets: { tokens: { level: <738 more>, at: now } } } }
 */
export function settleRelease(
  limits: CapacityLimits,
  state: CapacityState,
  facts: ReleaseFacts,
): ReleaseEffect {
  const { now, details } = facts;
  const provider = providerOf(details);
  // A budget learned from this very answer starts full (no entry), and is lowered to the
  // answer's `remaining` below.
  const learned = limits.adaptive === undefined ? state.learned : learn(state.learned, provider?.limits);
  const figures = budgetFigures(limits.rate, learned);
  let buckets = state.buckets;
  const usage = usageOf(details);
  if (facts.charged !== undefined && usage !== undefined) {
    const used: TokenCost = {
      input: tokenCount(usage.input) ?? facts.charged.input,
      output: tokenCount(usage.output) ?? facts.charged.output,
    };
    const charged = facts.charged;
    buckets = adjust(figures, buckets, (name) => costIn(name, charged) - costIn(name, used), now);
  }
  if (provider?.limits !== undefined) buckets = lowerToRemaining(figures, buckets, provider, now);

  let next: CapacityState = learned === undefined ? { ...state, buckets } : { ...state, buckets, learned };
  const pauseMs = pauseOf(provider);
  const throttled = pauseMs === undefined ? undefined : { status: statusOf(provider), retryAfterMs: pauseMs };
  if (throttled !== undefined) next = { ...next, pausedUntil: Math.max(next.pausedUntil, now + pauseMs!) };

  if (limits.adaptive === undefined) return { state: next, ...(throttled && { throttled }) };
  const step = adapt(
    next,
    { min: limits.adaptive.minConcurrent, max: limits.maxConcurrent },
    adaptiveSignal(facts, provider),
  );
  next = { ...next, ...step.state };
  return {
    state: next,
    ...(throttled && { throttled }),
    ...(step.changed && { limitChanged: step.changed }),
  };
}

/**
 * The usage a release reports, when it is an object. Providers send `usage: null` (OpenAI on
 * every stream chunk but the last), and a caller that passes it through must not make the
 * release throw: the slot is already given back and the waiters would never hear of it.
 */
function usageOf(details: ReleaseDetails | undefined): TokenCounts | undefined {
  const usage: unknown = details?.usage;
  return typeof usage === 'object' && usage !== null ? (usage as TokenCounts) : undefined;
}

/** A token count given by a caller: a finite number >= 0, else absent. */
function tokenCount(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : undefined;
}

/** The provider's feedback of a release, when it is an object (a caller may pass anything). */
function providerOf(details: ReleaseDetails | undefined): ProviderFeedback | undefined {
  const provider: unknown = details?.provider;
  return typeof provider === 'object' && provider !== null ? (provider as ProviderFeedback) : undefined;
}

export function statusOf(provider: ProviderFeedback | undefined): number | undefined {
  const status = provider?.status;
  return typeof status === 'number' && Number.isInteger(status) ? status : undefined;
}

function windowsOf(provider: ProviderFeedback | undefined): RateLimitWindow[] {
  const limits = provider?.limits;
  if (limits === undefined || limits === null || typeof limits !== 'object') return [];
  return BUDGET_NAMES.flatMap((name) => {
    const window = limits[name];
    return window !== undefined && window !== null && typeof window === 'object' ? [window] : [];
  });
}

/**
 * The provider's count includes other clients of the account: a `remaining` below our own
 * level is the truth, so the bucket comes down to it (never up: a higher figure may be a
 * window we do not model).
 */
function lowerToRemaining(
  figures: BudgetFigures,
  buckets: BucketLevels,
  provider: ProviderFeedback,
  now: number,
): BucketLevels {
  const lowered = adjust(
    figures,
    buckets,
    (name) => {
      const window = provider.limits?.[name];
      const remaining = tokenCount(window?.remaining);
      if (remaining === undefined) return 0;
      const level = levelAt(figures[name]!, buckets[name], now);
      return Math.min(0, remaining - level);
    },
    now,
  );
  return budgetsOf(figures).length === 0 ? buckets : lowered;
}

/**
 * How long this answer pauses the limiter, or `undefined` when it does not. The slot reads it
 * too, to tell the run's listeners (`provider-throttled`) what the limiter was told.
 */
export function pauseOf(provider: ProviderFeedback | undefined): number | undefined {
  if (provider === undefined || provider === null || typeof provider !== 'object') return undefined;
  const status = statusOf(provider);
  const exhausted = windowsOf(provider).filter((w) => tokenCount(w.remaining) === 0);
  if (!(status !== undefined && OVERLOAD_STATUSES.has(status)) && exhausted.length === 0) return undefined;
  const retryAfter = tokenCount(provider.retryAfterMs) ?? tokenCount(provider.limits?.retryAfterMs);
  const resets = exhausted.flatMap((w) => {
    const reset = tokenCount(w.resetMs);
    return reset === undefined ? [] : [reset];
  });
  const wait = retryAfter ?? (resets.length > 0 ? Math.max(...resets) : DEFAULT_PAUSE_MS);
  return Math.min(MAX_PAUSE_MS, Math.ceil(wait));
}

/**
 * What the release says to the adaptive limit: an overload status lowers it; a success (a
 * 2xx or 3xx status, or usage reported without a status) while the limit is in use counts
 * toward raising it. A release that says nothing (no details) is neither: a request that
 * failed before any answer tells nothing about the provider's capacity.
 */
function adaptiveSignal(facts: ReleaseFacts, provider: ProviderFeedback | undefined): AdaptiveSignal {
  const status = statusOf(provider);
  if (status !== undefined && OVERLOAD_STATUSES.has(status)) {
    return { kind: 'overload', grant: facts.grant, newestGrant: facts.newestGrant };
  }
  const answered =
    status !== undefined ? status >= 200 && status < 400 : usageOf(facts.details) !== undefined;
  return answered ? { kind: 'success', active: facts.active, grant: facts.grant } : { kind: 'none' };
}
