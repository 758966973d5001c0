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
  rateLimitsFromHeaders,
} from './concurrency/index.js';
export type {
  AcquireRequest,
  ConcurrencyEvent,
  ConcurrencyEventListener,
  ConcurrencyLease,
  ConcurrencyLimiter,
  ConcurrencyLimiterOptions,
  ConcurrencyStats,
  HeaderSource,
  ProviderFeedback,
  ProviderRateLimits,
  RateLimitWindow,
  ReleaseDetails,
  TokenCounts,
  WorkloadOptions,
} from './concurrency/index.js';
export { createAgent, Agent } from './agent/agent.js';
export type {
  AgentOptions,
  CompletedRun,
  PausedRun,
  ResumeOptions,
  RunOptions,
  RunResult,
  RunUsage,
} from './agent/agent.js';
export type {
  AnswerDecision,
  ApprovalDecision,
  PausedState,
  PendingToolCall,
  ToolDecision,
} from './agent/approvals.js';
export { askHuman } from './agent/questions.js';
export type { ChatMessage, ChatPart } from './agent/conversation.js';
export type { ToolEvent } from './agent/run-events.js';
export { RepairLimitError, RunTimeoutError } from './agent/errors.js';
export type { CompactionOptions, RetryOptions, RunBounds } from './agent/options.js';
export { tool } from './agent/tool.js';
export type {
  AskToolDefinition,
  ExecutedToolDefinition,
  Tool,
  ToolContext,
  ToolDefinition,
  JsonSchema,
} from './agent/tool.js';
export type { Credential, ModelSpec } from './models/model.js';
export { loadProviderCode, type ProviderCodeLoaded } from './models/provider-code.js';
