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
export { createAgent, Agent, RepairLimitError, RunTimeoutError } from './agent/agent.js';
export type { CompactionOptions } from './agent/compaction.js';
export type { AgentOptions, RunOptions, RunResult, RunUsage, RunBounds } from './agent/agent.js';
export type { RetryOptions } from './agent/provider-request.js';
export { tool } from './agent/tool.js';
export type { Tool, ToolContext, ToolDefinition, JsonSchema } from './agent/tool.js';
export type { Credential, ModelSpec } from './models/model.js';
