/**
 * `sluice/concurrency`: the provider-request limiter, the allocation rules every built-in
 * limiter shares, the slot lifecycle and the conformance suite for custom limiters.
 * No runtime dependencies.
 */
export { allocate, hasRoom } from './allocate.js';
export type { AllocationInput, AllocationLimits, AllocationResult, Grant, WaitingEntry } from './allocate.js';
export { ManualClock, systemClock, SECOND, MINUTE } from './clock.js';
export type { Clock, ClockTimer } from './clock.js';
export { concurrencyConformanceCases } from './conformance.js';
export type { ConformanceCase, ConformanceOptions } from './conformance.js';
export {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLeaseLostError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  TurnError,
  lineageOf,
} from './errors.js';
export type { ConcurrencyErrorFields, RequestLineage } from './errors.js';
export type {
  ConcurrencyEvent,
  ConcurrencyEventBase,
  ConcurrencyEventListener,
  ConcurrencyEventType,
  ReleaseOutcome,
} from './events.js';
export { createConcurrencyLimiter, InMemoryConcurrencyLimiter } from './in-memory-limiter.js';
export type {
  AcquireRequest,
  ConcurrencyLease,
  ConcurrencyLimiter,
  ConcurrencyStats,
  WorkloadStats,
} from './limiter.js';
export { limiterDefaults, resolveLimiterOptions, resolveWorkload } from './options.js';
export type {
  ConcurrencyLimiterOptions,
  ResolvedLimits,
  ResolvedWorkload,
  WorkloadOptions,
} from './options.js';
export { acquireSlot } from './slot.js';
export type { HeldSlot, SlotRequest } from './slot.js';
export { WaitQueue } from './wait-queue.js';
export type { QueueNode } from './wait-queue.js';
