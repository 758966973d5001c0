import type { AgentEvent, AgentTool } from '@mariozechner/pi-agent-core';
import {
  validateToolArguments,
  type AssistantMessage,
  type Message,
  type ToolCall,
  type ToolResultMessage,
} from '@mariozechner/pi-ai';
import { fail } from './options.js';
import { answeredResult, questionOf } from './questions.js';
import type { Tool } from './tool.js';

/**
 * A tool call the model made that waits for a person: for a decision before it runs (a tool
 * with `needsApproval`), or for an answer that becomes its result (a tool with `ask: true`).
 */
export interface PendingToolCall {
  /** The call's id, as the model gave it; a decision names it. */
  readonly id: string;
  readonly name: string;
  /** The arguments as the model sent them. */
  readonly arguments: Record<string, unknown>;
  /** `'question'` for a call of an ask tool; absent for a call waiting for approval. */
  readonly kind?: 'question';
  /** For a question: what the person is asked. */
  readonly question?: string;
}

/** A person's decision on a call waiting for approval. */
export interface ApprovalDecision {
  toolCallId: string;
  approved: boolean;
  /** Why it was declined (or approved); a declined call's result tells the model. */
  reason?: string;
}

/** A person's answer to a question: the call's result, as the model will read it. */
export interface AnswerDecision {
  toolCallId: string;
  answer: string;
}

/** A person's answer to one pending call: a decision for an approval, an answer for a question. */
export type ToolDecision = ApprovalDecision | AnswerDecision;

export const isQuestion = (call: PendingToolCall): boolean => call.kind === 'question';

/**
 * What a paused run needs to go on, as plain JSON: store it anywhere and give it back to
 * `agent.resume()`, from any process. `messages` are the run's own messages so far (the prompt,
 * the turns, the results of calls that needed no approval); the conversation's `history` is
 * not in it and is given again to `resume`.
 */
export interface PausedState {
  readonly version: 1;
  readonly systemPrompt: string;
  readonly messages: unknown[];
  readonly pending: PendingToolCall[];
  /** Provider requests sent before the pause, so the finished run's usage counts them. */
  readonly requests: number;
}

/**
 * Finds, in each answer of the model, the calls that wait for a person (those needing approval,
 * and every call of an ask tool), before the loop runs any tool of that turn. A call whose
 * arguments fail the tool's schema is left to the loop (it becomes an error result and a
 * repair), and a `needsApproval` that throws counts as "yes": a broken check must not let a
 * guarded call through.
 */
export class ApprovalGate {
  readonly #tools: Map<string, Tool<never>>;
  readonly #agentTools: Map<string, AgentTool>;
  readonly pending: PendingToolCall[] = [];

  constructor(tools: readonly Tool<never>[], agentTools: readonly AgentTool[]) {
    this.#tools = new Map(tools.map((t) => [t.name, t]));
    this.#agentTools = new Map(agentTools.map((t) => [t.name, t]));
  }

  isPending(toolCallId: string): boolean {
    return this.pending.some((p) => p.id === toolCallId);
  }

  /** Looks at a finished answer of the model; resolves once every call of it is decided. */
  async consider(message: AssistantMessage): Promise<void> {
    // A failed or aborted turn runs no tools: the run ends with its failure, not a pause.
    if (message.stopReason === 'error' || message.stopReason === 'aborted') return;
    for (const call of message.content) {
      if (call.type !== 'toolCall') continue;
      const own = this.#tools.get(call.name);
      const needs = own?.needsApproval;
      const agentTool = this.#agentTools.get(call.name);
      if (!agentTool || (own?.ask !== true && (needs === undefined || needs === false))) continue;
      let args: unknown;
      try {
        args = validateToolArguments(agentTool, call);
      } catch {
        continue;
      }
      if (own?.ask === true) {
        const question = questionOf(args as Record<string, unknown>);
        this.pending.push({
          id: call.id,
          name: call.name,
          arguments: call.arguments,
          kind: 'question',
          question,
        });
        continue;
      }
      let asks = true;
      if (typeof needs === 'function') {
        try {
          asks = (await (needs as (args: unknown) => boolean | Promise<boolean>)(args)) !== false;
        } catch {
          asks = true;
        }
      }
      if (asks) this.pending.push({ id: call.id, name: call.name, arguments: call.arguments });
    }
  }
}

/** The state a paused run hands out: its messages without the stand-in results of pending calls. */
export function pausedState(
  systemPrompt: string,
  messages: readonly Message[],
  pending: readonly PendingToolCall[],
  requests: number,
): PausedState {
  const waiting = new Set(pending.map((p) => p.id));
  const kept = messages.filter((m) => !(m.role === 'toolResult' && waiting.has(m.toolCallId)));
  return { version: 1, systemPrompt, messages: kept, pending: [...pending], requests };
}

/** Checks a paused state given back to `resume`, so a wrong object fails before anything is sent. */
export function checkPausedState(value: unknown): PausedState {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    fail('paused', 'the `state` of a paused run', value);
  const state = value as Record<string, unknown>;
  if (state.version !== 1) fail('paused.version', '1', state.version);
  if (typeof state.systemPrompt !== 'string') fail('paused.systemPrompt', 'a string', state.systemPrompt);
  if (!Array.isArray(state.messages) || state.messages.length === 0)
    fail('paused.messages', 'a non-empty list of messages', state.messages);
  if (!Array.isArray(state.pending) || state.pending.length === 0)
    fail('paused.pending', 'a non-empty list of pending tool calls', state.pending);
  state.pending.forEach((p: unknown, i) => {
    const call = p as Record<string, unknown> | null;
    if (typeof call?.id !== 'string') fail(`paused.pending[${i}].id`, 'a string', call?.id);
    if (typeof call.name !== 'string') fail(`paused.pending[${i}].name`, 'a string', call.name);
  });
  if (typeof state.requests !== 'number') fail('paused.requests', 'a number', state.requests);
  return state as unknown as PausedState;
}

/**
 * Checks the decisions against the pending calls: each pending call answered exactly once
 * (an approval with `approved`, a question with a string `answer`), and nothing else
 * answered. Errors name the field (`decisions[2].toolCallId`).
 */
export function checkDecisions(
  pending: readonly PendingToolCall[],
  decisions: unknown,
  field = 'decisions',
): Map<string, ToolDecision> {
  if (!Array.isArray(decisions)) fail(field, 'a list of decisions', decisions);
  const ids = pending.map((p) => p.id);
  const answered = new Map<string, ToolDecision>();
  decisions.forEach((d: unknown, i) => {
    const at = `${field}[${i}]`;
    if (typeof d !== 'object' || d === null || Array.isArray(d)) fail(at, 'a decision', d);
    const { toolCallId, approved, reason, answer } = d as Record<string, unknown>;
    if (typeof toolCallId !== 'string' || !ids.includes(toolCallId))
      fail(`${at}.toolCallId`, `one of the pending calls (${ids.join(', ')})`, toolCallId);
    if (answered.has(toolCallId)) fail(`${at}.toolCallId`, 'a call not answered before', toolCallId);
    if (isQuestion(pending.find((p) => p.id === toolCallId)!)) {
      if (typeof answer !== 'string') fail(`${at}.answer`, 'the answer, a string', answer);
    } else {
      if (typeof approved !== 'boolean') fail(`${at}.approved`, 'true or false', approved);
      if (reason !== undefined && typeof reason !== 'string') fail(`${at}.reason`, 'a string', reason);
    }
    answered.set(toolCallId, d as ToolDecision);
  });
  const missing = ids.filter((id) => !answered.has(id));
  if (missing.length > 0)
    fail(field, `an answer for every pending call (missing: ${missing.join(', ')})`, decisions);
  return answered;
}

/** The result the model sees for a call a person declined. */
export function declinedResult(
  call: PendingToolCall,
  reason: string | undefined,
  now: number,
): ToolResultMessage {
  const why = reason?.trim() ? ` Reason: ${reason.trim()}` : '';
  return {
    role: 'toolResult',
    toolCallId: call.id,
    toolName: call.name,
    content: [{ type: 'text', text: `The user declined this call to ${call.name}; it did not run.${why}` }],
    isError: true,
    timestamp: now,
  };
}

/** The pending call as the loop's tool call block, for running an approved one. */
export function toolCallOf(call: PendingToolCall): ToolCall {
  return { type: 'toolCall', id: call.id, name: call.name, arguments: call.arguments };
}

/**
 * The results of the pending calls once decided: an approved call runs as the loop would run
 * it (its schema checked again, the run's tool bounds applied), a declined one gets a result
 * that says so, and an answered question has the answer as its result (heard as a call that
 * started and completed). Approved calls run at once, as a turn's calls do; results keep the
 * calls' order.
 */
export async function decidedResults(
  pending: readonly PendingToolCall[],
  decisions: Map<string, ToolDecision>,
  agentTools: readonly AgentTool[],
  forward: (event: AgentEvent) => void,
  now: () => number,
): Promise<ToolResultMessage[]> {
  return Promise.all(
    pending.map(async (call): Promise<ToolResultMessage> => {
      // checkDecisions gave each call the decision of its kind.
      const decision = decisions.get(call.id)!;
      if (isQuestion(call)) return answered(call, (decision as AnswerDecision).answer, forward, now);
      const { approved, reason } = decision as ApprovalDecision;
      if (!approved) return declinedResult(call, reason, now());
      forward({
        type: 'tool_execution_start',
        toolCallId: call.id,
        toolName: call.name,
        args: call.arguments,
      });
      let content: ToolResultMessage['content'];
      let isError = false;
      try {
        const agentTool = agentTools.find((t) => t.name === call.name);
        if (!agentTool) throw new Error(`Tool ${call.name} not found`);
        const args: unknown = validateToolArguments(agentTool, toolCallOf(call));
        content = (await agentTool.execute(call.id, args, undefined)).content;
      } catch (error) {
        content = [{ type: 'text', text: error instanceof Error ? error.message : String(error) }];
        isError = true;
      }
      forward({
        type: 'tool_execution_end',
        toolCallId: call.id,
        toolName: call.name,
        result: { content, details: undefined },
        isError,
      });
      return {
        role: 'toolResult',
        toolCallId: call.id,
        toolName: call.name,
        content,
        isError,
        timestamp: now(),
      };
    }),
  );
}

function answered(
  call: PendingToolCall,
  answer: string,
  forward: (event: AgentEvent) => void,
  now: () => number,
): ToolResultMessage {
  forward({ type: 'tool_execution_start', toolCallId: call.id, toolName: call.name, args: call.arguments });
  const result = answeredResult(call, answer, now());
  forward({
    type: 'tool_execution_end',
    toolCallId: call.id,
    toolName: call.name,
    result: { content: result.content, details: undefined },
    isError: false,
  });
  return result;
}
