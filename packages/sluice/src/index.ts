/**
 * Sluice: bound AI-agent work. Every model-provider request takes a slot from a limiter
 * shared by every agent, run, retry and nested agent.
 */
export {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLeaseLostError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  TurnError,
  createConcurrencyLimiter,
  InMemoryConcurrencyLimiter,
} from './concurrency/index.js';
export type {
  AcquireRequest,
  ConcurrencyEvent,
  ConcurrencyEventListener,
  ConcurrencyLease,
  ConcurrencyLimiter,
  ConcurrencyLimiterOptions,
  ConcurrencyStats,
  WorkloadOptions,
} from './concurrency/index.js';
