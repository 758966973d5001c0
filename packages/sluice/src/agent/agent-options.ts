import type { Clock } from '../concurrency/clock.js';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import type { Credential, ModelSpec } from '../models/model.js';
import type { PausedState, ToolDecision } from './approvals.js';
import type { ChatMessage } from './conversation.js';
import type { CompactionOptions, RetryOptions, RunBounds } from './options.js';
import type { RunEvents } from './run-events.js';
import type { JsonSchema, Tool } from './tool.js';

/** The options of `createAgent`, `run`, `stream` and `resume`, as callers give them. */

export interface AgentOptions<W extends string> {
  model: ModelSpec;
  /** The system prompt. */
  instructions?: string;
  tools?: readonly Tool<never>[] | readonly Tool<Record<string, unknown>>[];
  /** One API key, or several tried in order. Default: the provider's usual environment variable. */
  credentials?: Credential | Credential[];
  /**
   * The limiter every provider request of this agent takes a slot from, and its workload.
   * Without one, the agent's runs take no slots, except inside another agent's run, where
   * they use their parent's limiter.
   */
  concurrency?: {
    limiter: ConcurrencyLimiter<W>;
    workload?: NoInfer<W>;
    /**
     * The output tokens each provider request is expected to use, charged to the limiter's
     * token budgets until the response's usage settles them. A whole number from 0.
     * @default the request's output-token cap
     */
    outputTokens?: number;
  };
  /** Hears the concurrency events of every run of this agent (and of their child runs). */
  events?: { onConcurrency?: ConcurrencyEventListener };
  bounds?: RunBounds;
  retry?: RetryOptions;
  /**
   * Corrective turns allowed in a run: after a call to an unknown tool, arguments that fail a
   * tool's schema, or a final answer that fails `run({ schema })`. Each is a provider request
   * with its own slot. @default 2
   */
  maxRepairs?: number;
  /**
   * Summarise older messages when the conversation grows too large (or the provider says so).
   * @default no summary before the provider reports an overflow
   */
  compaction?: CompactionOptions;
  /**
   * Time source of the agent's runs: their budgets, turn and tool timeouts, retry waits and
   * the slot events' times. Tests pass a `ManualClock` (from `sluice/concurrency`), usually
   * the one their limiter has. @default the system clock
   */
  clock?: Clock;
}

export interface RunOptions<W extends string> {
  /** The run's new input: a prompt, or several messages (e.g. a client's message list). */
  prompt: string | readonly ChatMessage[];
  /**
   * Earlier conversation (a thread), sent as context before the prompt; not part of this run's
   * new messages. The texts of `system` messages, here or in `prompt`, follow the agent's
   * instructions in the system prompt.
   */
  history?: readonly ChatMessage[];
  /**
   * Bounds for this run only. They can tighten the agent's, never loosen them: each is the
   * smaller of the agent's and this where both are set (either alone applies as given).
   */
  bounds?: RunBounds;
  /** The run's whole time budget, slot waits included. A child stays within its parent's. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /**
   * `workload`: a workload of the agent's limiter for this run. `key`: who the run works for
   * (a tenant, a user): among the requests waiting in one workload, keys take turns, so one
   * key's burst cannot hold another key's requests back for long. The run's child runs keep
   * its key unless they set their own. 1 to 256 characters.
   */
  concurrency?: {
    workload?: W;
    key?: string;
    /** The expected output tokens of this run's provider requests. @default the agent's */
    outputTokens?: number;
  };
  /** Listeners of this run; one that throws is ignored. */
  events?: RunEvents;
  /** JSON Schema the final answer must match, as JSON; the parsed value is `result.data`. */
  schema?: JsonSchema;
}

/**
 * Continues a run that paused for approvals or questions. It gets the agent's tools and bounds as any run
 * does, and a time budget of its own (`timeoutMs` starts again: the pause is not counted).
 */
export interface ResumeOptions<W extends string> extends Omit<RunOptions<W>, 'prompt'> {
  /** The paused run's `state`, as it came (or as JSON that was stored and read back). */
  paused: PausedState;
  /** One decision for each pending call (`{ toolCallId, answer }` for a question), no more. */
  decisions: readonly ToolDecision[];
}
