/**
 * `sluice/concurrency`: the provider-request limiter, the slot lifecycle, and what it takes
 * to write a limiter of your own. No runtime dependencies.
 */

// The limiter, its slots, errors and events: what an application uses.
export { createConcurrencyLimiter, InMemoryConcurrencyLimiter } from './in-memory-limiter.js';
export type {
  AcquireRequest,
  ConcurrencyLease,
  ConcurrencyLimiter,
  ConcurrencyStats,
  WorkloadStats,
} from './limiter.js';
export type { ConcurrencyLimiterOptions, WorkloadOptions } from './options.js';
export type {
  AdaptiveOptions,
  BudgetName,
  BudgetStats,
  BudgetsStats,
  ProviderFeedback,
  ProviderRateLimits,
  RateLimitWindow,
  RateOptions,
  ReleaseDetails,
  TokenCounts,
} from './capacity-types.js';
export { rateLimitsFromHeaders } from './rate-limit-headers.js';
export { agedRateLimits } from './rate-limit-age.js';
export type { HeaderSource } from './rate-limit-headers.js';
export { AbortWatch } from './abort-watch.js';
export { acquireSlot } from './slot.js';
export type { HeldSlot, SlotRequest } from './slot.js';
export {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLeaseLostError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  TurnError,
} from './errors.js';
export type { ConcurrencyErrorFields, RequestLineage } from './errors.js';
export type {
  ConcurrencyEvent,
  ConcurrencyEventBase,
  ConcurrencyEventListener,
  ConcurrencyEventType,
  ReleaseOutcome,
} from './events.js';
export { ManualClock, systemClock, SECOND, MINUTE } from './clock.js';
export type { Clock, ClockTimer } from './clock.js';

// Extension API, for a limiter of your own (the PostgreSQL limiter is built from these): the
// allocation rules, option checks, request preparation, errors and stats that the built-in
// limiters share, and the conformance suite it must pass.
export { allocate, IMPLICIT_KEY, MAX_KEY_LENGTH, servingOrder, startTag } from './allocate.js';
export type {
  AllocationInput,
  AllocationLimits,
  AllocationResult,
  Grant,
  KeyHistory,
  WaitingEntry,
} from './allocate.js';
export { effectiveLimits } from './allocate.js';
export type { AllocationCapacity } from './allocate.js';
export { BUDGET_NAMES, budgetStats, levelAt } from './budgets.js';
export type { BucketLevel, BucketLevels, BudgetFigures, TokenCost } from './budgets.js';
export {
  capacityAt,
  DEFAULT_PAUSE_MS,
  initialCapacity,
  MAX_PAUSE_MS,
  OVERLOAD_STATUSES,
  settleRelease,
} from './capacity.js';
export type { CapacityLimits, CapacityState, ReleaseEffect, ReleaseFacts } from './capacity.js';
export { DECREASE_FACTOR } from './adaptive.js';
export { budgetFigures, learn, parseLearned } from './learned.js';
export type { LearnedBudget, LearnedBudgets } from './learned.js';
export { adaptiveFloor, optionError, resolveKey, resolveLimiterOptions, resolveWorkload } from './options.js';
export type { ResolvedAdaptive, ResolvedLimits, ResolvedWorkload } from './options.js';
export { limiterErrors, prepareAcquire, resolveTokens, statsOf } from './front.js';
export type { LimiterErrors, PreparedAcquire, WorkloadCounts } from './front.js';
export { lineageOf } from './errors.js';
export { concurrencyConformanceCases } from './conformance.js';
export type { ConformanceCase, ConformanceOptions } from './conformance.js';
