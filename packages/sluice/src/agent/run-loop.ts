import {
  runAgentLoop,
  runAgentLoopContinue,
  type AgentEvent,
  type AgentLoopConfig,
  type AgentMessage,
  type AgentTool,
} from '@mariozechner/pi-agent-core';
import type { Api, AssistantMessage, Message, Model } from '@mariozechner/pi-ai';
import type { Clock } from '../concurrency/clock.js';
import type { ApprovalGate } from './approvals.js';
import type { RunCompaction } from './compaction.js';
import type { Conversation } from './conversation.js';
import { answerCorrection, checkAnswer, toolCallProblem, type RepairCounter } from './repairs.js';
import { textOf, type RunRequests } from './run-requests.js';
import type { RunScope } from './scope.js';
import type { JsonSchema } from './tool.js';

/** What one pass of a run through pi-agent-core's loop works with. */
export interface RunLoopInit {
  readonly scope: RunScope;
  readonly model: Model<Api>;
  readonly conversation: Conversation;
  readonly tools: AgentTool[];
  readonly gate: ApprovalGate;
  readonly repairs: RepairCounter;
  readonly requests: RunRequests;
  readonly compaction: RunCompaction;
  /** The schema the final answer must match, if any. */
  readonly schema: JsonSchema | undefined;
  /** Hands the loop's events on to the run's listeners. */
  readonly forward: (event: AgentEvent) => void;
  readonly clock: Clock;
}

/**
 * One run's pass through pi-agent-core's loop: the rules the loop asks about after each turn
 * (stop, or correct the final answer), the bridge from its events to the run's trace, gate
 * and listeners, and the answers it produced, which the run's result and usage are made of.
 */
export class RunLoop {
  readonly #init: RunLoopInit;
  readonly #known: Map<string, AgentTool>;
  /** The loop replays the prompt messages as events; an assistant one among them is input. */
  readonly #prompts: Set<unknown>;
  #last: AssistantMessage | undefined;
  #data: unknown;
  /** The assistant messages of this pass, in order (failed and cancelled ones included). */
  readonly answered: AssistantMessage[] = [];

  constructor(init: RunLoopInit) {
    this.#init = init;
    this.#known = new Map(init.tools.map((t) => [t.name, t]));
    this.#prompts = new Set<unknown>(init.conversation.prompts);
  }

  /** The final answer parsed against the schema; undefined without one or before it matched. */
  get data(): unknown {
    return this.#data;
  }

  /**
   * Runs the loop to its end: from the prompts for a new run, or, for a resumed one, on from
   * the `earlier` messages (the paused run's and the decided calls' results).
   */
  run(earlier: readonly Message[] | undefined): Promise<AgentMessage[]> {
    const { conversation, tools, scope, requests } = this.#init;
    const config = this.#config();
    if (earlier) {
      return runAgentLoopContinue(
        { systemPrompt: conversation.systemPrompt, messages: [...conversation.history, ...earlier], tools },
        config,
        this.#emit,
        scope.signal,
        requests.stream,
      );
    }
    return runAgentLoop(
      conversation.prompts,
      { systemPrompt: conversation.systemPrompt, messages: conversation.history, tools },
      config,
      this.#emit,
      scope.signal,
      requests.stream,
    );
  }

  #config(): AgentLoopConfig {
    return {
      model: this.#init.model,
      convertToLlm: (m) => m as Message[],
      toolExecution: 'parallel',
      transformContext: (current) => this.#init.compaction.beforeTurn(current),
      shouldStopAfterTurn: ({ message }) => this.#stopAfterTurn(message),
      getFollowUpMessages: async () => this.#followUp(),
    };
  }

  #stopAfterTurn(message: AgentMessage): boolean {
    const { requests, repairs, gate } = this.#init;
    if (requests.failure) return true;
    const problem =
      (message as Message).role === 'assistant'
        ? toolCallProblem(message as AssistantMessage, this.#known)
        : undefined;
    // A turn with calls waiting for a person ends the loop: the run pauses.
    return (problem !== undefined && !repairs.take(problem)) || gate.pending.length > 0;
  }

  /** The final answer: with a schema, it must be JSON that matches it, else a correction follows. */
  #followUp(): AgentMessage[] {
    const { schema, requests, repairs, clock } = this.#init;
    if (!schema || requests.failure || this.#last?.stopReason !== 'stop') return [];
    const check = checkAnswer(textOf(this.#last), schema);
    this.#data = check.ok ? check.data : undefined;
    if (check.ok || !repairs.take(`final answer: ${check.problem}`)) return [];
    return [{ role: 'user', content: answerCorrection(check.problem, schema), timestamp: clock.now() }];
  }

  readonly #emit = (event: AgentEvent): Promise<void> | void => {
    const { scope, gate, forward } = this.#init;
    if (event.type === 'turn_start') scope.trace.turnStarted();
    else if (event.type === 'turn_end') scope.trace.turnEnded(event.message as AssistantMessage);
    // Calls waiting for a person neither start nor end: they have not run.
    if (
      (event.type === 'tool_execution_start' || event.type === 'tool_execution_end') &&
      gate.isPending(event.toolCallId)
    )
      return;
    forward(event);
    if (
      event.type === 'message_end' &&
      (event.message as Message).role === 'assistant' &&
      !this.#prompts.has(event.message)
    ) {
      this.#last = event.message as AssistantMessage;
      this.answered.push(this.#last);
      // The loop waits for this before it runs any call of the turn.
      return gate.consider(this.#last);
    }
  };
}
