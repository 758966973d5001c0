import type { AgentMessage } from '@mariozechner/pi-agent-core';
import type { AssistantMessage, Message } from '@mariozechner/pi-ai';
import type { PausedState, PendingToolCall } from './approvals.js';

/** What a run gives back: its answer, or its pause, and what it spent. */

export interface RunUsage {
  input: number;
  output: number;
  totalTokens: number;
  cost: number;
  /** Provider requests sent, retries and fallbacks included. */
  requests: number;
}

interface RunOutcome {
  /** The answer; when paused, the text the model said before its calls. */
  text: string;
  /**
   * The conversation of this run: the prompt, the assistant turns and the tool results (not
   * `history`). A resumed run's messages begin with those of the run before its pause.
   */
  messages: unknown[];
  /** What the whole run spent, across its pauses. */
  usage: RunUsage;
  runId: string;
}

/** A run that reached its final answer. */
export interface CompletedRun<T = unknown> extends RunOutcome {
  status: 'completed';
  /** The final answer parsed and checked against `run({ schema })`; undefined without a schema. */
  data: T;
}

/**
 * A run that stopped because the model called tools marked `needsApproval`, or tools with
 * `ask: true` (questions, `kind: 'question'` among the pending calls). It holds nothing (no
 * slot, no timer): give `state` and a decision for each pending call (an answer for each
 * question) to `agent.resume()`. The calls of the same turn that needed no person have run
 * already; their results are in `messages`.
 */
export interface PausedRun extends RunOutcome {
  status: 'requires_action';
  data: undefined;
  pendingToolCalls: PendingToolCall[];
  state: PausedState;
}

export type RunResult<T = unknown> = CompletedRun<T> | PausedRun;

/**
 * A failed or cancelled run still consumed tokens: its error carries `usage` (what the provider
 * requests sent before the failure cost), so spend accounting can count it. Set on the error
 * object itself, not enumerable; an error that cannot take it (frozen, or not an object) is
 * thrown as it is.
 */
export function withUsage(error: unknown, usage: RunUsage): unknown {
  if (error !== null && typeof error === 'object' && Object.isExtensible(error) && !('usage' in error)) {
    Object.defineProperty(error, 'usage', { value: usage, enumerable: false, configurable: true });
  }
  return error;
}

export function usageOf(messages: readonly AgentMessage[], requests: number): RunUsage {
  const usage: RunUsage = { input: 0, output: 0, totalTokens: 0, cost: 0, requests };
  for (const m of messages) {
    if ((m as Message).role !== 'assistant') continue;
    const u = (m as AssistantMessage).usage;
    usage.input += u.input;
    usage.output += u.output;
    usage.totalTokens += u.totalTokens;
    usage.cost += u.cost.total;
  }
  return usage;
}
