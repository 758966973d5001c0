import type { AgentMessage } from '@mariozechner/pi-agent-core';
import type { AssistantMessage, Message } from '@mariozechner/pi-ai';
import { pausedState, type ApprovalGate } from './approvals.js';
import { usageOf, withUsage, type RunResult } from './results.js';
import { textOf } from './run-requests.js';
import type { RunScope } from './scope.js';

/** How a run's loop ended, as the run's result is made from it. */
export interface RunEnd {
  readonly scope: RunScope;
  readonly systemPrompt: string;
  /** The run's messages: a resumed run's earlier ones, then the loop's. */
  readonly messages: AgentMessage[];
  /** Provider requests sent by the whole run, across its pauses. */
  readonly sent: number;
  /** Why a turn failed or the repairs ran out; undefined when neither happened. */
  readonly failure: Error | undefined;
  readonly gate: ApprovalGate;
  readonly data: unknown;
}

/**
 * The run's result once its loop has ended: it throws the run's failure or cancellation (with
 * what the run spent), pauses when calls wait for a decision, else completes.
 */
export function runResult(end: RunEnd): RunResult {
  const { scope, messages, sent, gate } = end;
  const usage = usageOf(messages, sent);
  // Every failed turn's outcome carries its failure, so a turn that ended in error needs no
  // second look; a cancelled turn leaves the run's signal aborted.
  if (end.failure) throw withUsage(end.failure, usage);
  if (scope.signal.aborted) throw withUsage(scope.signal.reason, usage);
  const text = textOf(messages.findLast((m): m is AssistantMessage => (m as Message).role === 'assistant'));
  if (gate.pending.length > 0) {
    const state = pausedState(end.systemPrompt, messages as Message[], gate.pending, sent);
    return {
      status: 'requires_action',
      text,
      messages: state.messages,
      usage,
      runId: scope.runId,
      data: undefined,
      pendingToolCalls: state.pending,
      state,
    };
  }
  return { status: 'completed', text, messages, usage, runId: scope.runId, data: end.data };
}
