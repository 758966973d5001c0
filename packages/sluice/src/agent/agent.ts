import { randomUUID } from 'node:crypto';
import {
  runAgentLoop,
  runAgentLoopContinue,
  type AgentEvent,
  type AgentMessage,
} from '@mariozechner/pi-agent-core';
import type { AssistantMessage, Message } from '@mariozechner/pi-ai';
import type { Clock } from '../concurrency/clock.js';
import { ConcurrencyConfigError } from '../concurrency/errors.js';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import { resolveCredentials, resolveModel, type Credential, type ModelSpec } from '../models/model.js';
import {
  ApprovalGate,
  decidedResults,
  pausedState,
  type PausedState,
  type ToolDecision,
} from './approvals.js';
import { compactMessages } from './compaction.js';
import { usageOf, withUsage, type RunResult } from './results.js';
import type { ChatMessage } from './conversation.js';
import {
  duration,
  resolveRuntimeOptions,
  runBounds,
  type CompactionOptions,
  type ResolvedRuntimeOptions,
  type RetryOptions,
  type RunBounds,
} from './options.js';
import { answerCorrection, checkAnswer, RepairCounter, toolCallProblem } from './repairs.js';
import { checkRunEvents, forwardRunEvents, type RunEvents } from './run-events.js';
import { RunRequests, textOf } from './run-requests.js';
import { openScope, runFields, runScope, type RunScope } from './scope.js';
import { toAgentTools } from './tool-calls.js';
import type { JsonSchema, Tool } from './tool.js';
import { runConcurrency, runConversation, type ConversationPlan } from './run-plan.js';
import { RunTrace } from './tracing.js';

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
  concurrency?: { limiter: ConcurrencyLimiter<W>; workload?: NoInfer<W> };
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
  concurrency?: { workload?: W; key?: string };
  /** Listeners of this run; one that throws is ignored. */
  events?: RunEvents;
  /** JSON Schema the final answer must match, as JSON; the parsed value is `result.data`. */
  schema?: JsonSchema;
}

/**
 * Continues a run that paused for approvals. It gets the agent's tools and bounds as any run
 * does, and a time budget of its own (`timeoutMs` starts again: the pause is not counted).
 */
export interface ResumeOptions<W extends string> extends Omit<RunOptions<W>, 'prompt'> {
  /** The paused run's `state`, as it came (or as JSON that was stored and read back). */
  paused: PausedState;
  /** One decision for each pending call, no more. */
  decisions: readonly ToolDecision[];
}

export type { CompletedRun, PausedRun, RunResult, RunUsage } from './results.js';

/** What `#start` checked and worked out of a run's options, for `#run`. */
interface RunPlan extends ConversationPlan {
  readonly bounds: ResolvedRuntimeOptions['bounds'];
  readonly forward: (event: AgentEvent) => void;
}

/**
 * An agent: a model, instructions and tools, whose every provider request takes a slot from
 * its limiter (or, when it runs inside another agent's tool, from its parent's). `W` is the
 * union of its limiter's workload names; an agent without a limiter is `Agent<never>`.
 */
export class Agent<W extends string = never> {
  readonly #options: AgentOptions<W>;
  readonly #model: ReturnType<typeof resolveModel>;
  readonly #credentials: Credential[];
  readonly #runtime: ResolvedRuntimeOptions;

  constructor(options: AgentOptions<W>) {
    this.#options = options;
    this.#model = resolveModel(options.model);
    this.#credentials = resolveCredentials(this.#model, options.credentials);
    this.#runtime = resolveRuntimeOptions(options);
    const limiter = options.concurrency?.limiter;
    if (limiter?.validateWorkload) {
      // A limiter with several workloads and no default: the agent must pick one.
      limiter.validateWorkload(options.concurrency?.workload);
    } else if (options.concurrency && !limiter) {
      throw new ConcurrencyConfigError('Expected `concurrency.limiter` to be a limiter', {
        limiter: 'none',
        field: 'concurrency.limiter',
      });
    }
  }

  /**
   * Checks a workload a run of this agent may ask for (`run({ concurrency: { workload } })`)
   * before any run does, and returns it as its limiter names it: a `ConcurrencyConfigError` when
   * the limiter lacks it. Undefined for an agent without a limiter of its own, whose runs take
   * no slots (or their parent run's): there is no workload to choose.
   */
  checkWorkload(workload: string): W | undefined {
    const limiter = this.#options.concurrency?.limiter;
    if (!limiter) return undefined;
    return limiter.validateWorkload ? limiter.validateWorkload(workload) : (workload as W);
  }

  /**
   * The agent's own limiter, if it has one (not a parent's, which is known only inside a run).
   * A server reads it to report every limiter's slots, including those no run has touched yet.
   */
  get limiter(): ConcurrencyLimiter<W> | undefined {
    return this.#options.concurrency?.limiter;
  }

  /** Runs the agent to its final answer. */
  async run<T = unknown>(options: RunOptions<W>): Promise<RunResult<T>> {
    return this.#start(options, undefined) as Promise<RunResult<T>>;
  }

  /**
   * Continues a paused run (`result.status === 'requires_action'`) with a decision for each
   * pending call: approved calls run, declined ones become a result that tells the model, and
   * the run goes on. It may pause again. Give the same `history` as the first run had.
   */
  async resume<T = unknown>(options: ResumeOptions<W>): Promise<RunResult<T>> {
    return this.#start(options, undefined) as Promise<RunResult<T>>;
  }

  /**
   * Runs the agent like `run`, giving the answer's text as it streams. Iterate for the text
   * deltas (of every assistant turn); `result` resolves like `run()`.
   *
   * @example
   * const s = agent.stream({ prompt });
   * for await (const delta of s) process.stdout.write(delta);
   * const { usage } = await s.result;
   */
  stream(options: RunOptions<W>): AsyncIterable<string> & { result: Promise<RunResult> } {
    const queue: string[] = [];
    let wake: (() => void) | undefined;
    let finished = false;
    const result = this.#start(options, (delta) => {
      queue.push(delta);
      wake?.();
    });
    const settle = () => {
      finished = true;
      wake?.();
    };
    result.then(settle, settle);
    return {
      result,
      async *[Symbol.asyncIterator]() {
        for (;;) {
          while (queue.length > 0) yield queue.shift()!;
          if (finished) {
            await result; // a failed run fails the iteration too
            return;
          }
          await new Promise<void>((resolve) => (wake = resolve));
          wake = undefined;
        }
      },
    };
  }

  async #start(
    options: RunOptions<W> | ResumeOptions<W>,
    onText: ((delta: string) => void) | undefined,
  ): Promise<RunResult> {
    // Everything the caller gave is checked before a slot is asked for or a request sent.
    const { conversation, resume } = runConversation(
      this.#options.instructions,
      options,
      this.#model,
      this.#runtime.clock,
    );
    const bounds = runBounds(this.#runtime.bounds, options.bounds);
    const events = checkRunEvents(options.events);
    const timeoutMs =
      options.timeoutMs === undefined ? undefined : duration('timeoutMs', options.timeoutMs, { zero: true });
    const parent = runScope.getStore();
    const runId = randomUUID();
    const lineage = { runId, rootRunId: parent?.rootRunId ?? runId, parentRunId: parent?.runId };
    const { limiter, workload, key } = runConcurrency(
      this.#options.concurrency as { limiter: ConcurrencyLimiter<string>; workload?: string } | undefined,
      options,
      parent,
      lineage,
    );
    const trace = new RunTrace({ ...lineage, limiter: limiter?.name, workload, model: this.#model });
    const { scope, close } = openScope({
      runId,
      parent,
      limiter,
      workload,
      key,
      clock: this.#runtime.clock,
      timeoutMs,
      signal: options.signal,
      listeners: [this.#options.events?.onConcurrency, events.onConcurrency].filter(
        (l): l is ConcurrencyEventListener => l !== undefined,
      ),
      trace,
    });
    try {
      const forward = forwardRunEvents(events, onText);
      const result = await runScope.run(scope, () =>
        this.#run(scope, options, { conversation, bounds, forward, resume }),
      );
      trace.end(result.usage);
      return result;
    } catch (error) {
      trace.end({ error });
      throw error;
    } finally {
      close();
    }
  }

  async #run(scope: RunScope, options: Pick<RunOptions<W>, 'schema'>, plan: RunPlan): Promise<RunResult> {
    const { conversation, bounds, forward, resume } = plan;
    const { compaction, clock } = this.#runtime;
    const own = (this.#options.tools ?? []) as readonly Tool<never>[];
    const tools = toAgentTools(own, scope, bounds, (id) => gate.isPending(id));
    const gate = new ApprovalGate(own, tools);
    const known = new Map(tools.map((t) => [t.name, t]));
    const repairs = new RepairCounter(this.#runtime.maxRepairs, runFields(scope));
    // Set when the provider reported an overflow: the run's own conversation is compacted
    // before its next turn too, not only the request that overflowed.
    let compactNext = false;
    const summarize = (messages: readonly Message[]): Promise<Message[]> =>
      compactMessages(messages, {
        keepLast: compaction.keepLast,
        now: () => clock.now(),
        summarize: (context) => requests.text(this.#model, context),
      });
    const requests = new RunRequests({
      scope,
      credentials: this.#credentials,
      retry: this.#runtime.retry,
      turnTimeoutMs: bounds.turnTimeoutMs,
      onOverflow: async (context) => {
        compactNext = true;
        return { ...context, messages: await summarize(context.messages) };
      },
    });

    let lastAssistant: AssistantMessage | undefined;
    const answered: AssistantMessage[] = [];
    let data: unknown;
    // The loop replays the prompt messages as events; an assistant one among them is input,
    // not an answer of this run.
    const prompts = new Set<unknown>(conversation.prompts);
    const priorRequests = resume?.state.requests ?? 0;
    // A resumed run starts from the paused run's messages and the decided calls' results.
    const earlier: Message[] = resume
      ? [
          ...(resume.state.messages as Message[]),
          ...(await decidedResults(resume.state.pending, resume.decisions, tools, forward, () =>
            clock.now(),
          )),
        ]
      : [];
    if (scope.signal.aborted) throw withUsage(scope.signal.reason, usageOf(earlier, priorRequests));
    const config: Parameters<typeof runAgentLoop>[2] = {
      model: this.#model,
      convertToLlm: (m) => m as Message[],
      toolExecution: 'parallel',
      transformContext: async (current) => {
        const tooLarge =
          compaction.maxChars !== undefined && JSON.stringify(current).length > compaction.maxChars;
        if (!tooLarge && !compactNext) return current;
        compactNext = false;
        // A summary that fails rejects the loop, so the run ends with its failure before
        // another request is sent.
        return (await summarize(current as Message[])) as AgentMessage[];
      },
      shouldStopAfterTurn: ({ message }) => {
        if (requests.failure) return true;
        const problem =
          (message as Message).role === 'assistant'
            ? toolCallProblem(message as AssistantMessage, known)
            : undefined;
        // A turn with calls waiting for a person ends the loop: the run pauses.
        return (problem !== undefined && !repairs.take(problem)) || gate.pending.length > 0;
      },
      getFollowUpMessages: async () => {
        // The final answer: with a schema, it must be JSON that matches it.
        if (!options.schema || requests.failure || lastAssistant?.stopReason !== 'stop') return [];
        const check = checkAnswer(textOf(lastAssistant), options.schema);
        data = check.ok ? check.data : undefined;
        if (check.ok || !repairs.take(`final answer: ${check.problem}`)) return [];
        return [
          {
            role: 'user',
            content: answerCorrection(check.problem, options.schema),
            timestamp: clock.now(),
          },
        ];
      },
    };
    const emit = (event: AgentEvent): Promise<void> | void => {
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
        !prompts.has(event.message)
      ) {
        lastAssistant = event.message as AssistantMessage;
        answered.push(lastAssistant);
        // The loop waits for this before it runs any call of the turn.
        return gate.consider(lastAssistant);
      }
    };
    const loop = resume
      ? runAgentLoopContinue(
          { systemPrompt: conversation.systemPrompt, messages: [...conversation.history, ...earlier], tools },
          config,
          emit,
          scope.signal,
          requests.stream,
        )
      : runAgentLoop(
          conversation.prompts,
          { systemPrompt: conversation.systemPrompt, messages: conversation.history, tools },
          config,
          emit,
          scope.signal,
          requests.stream,
        );
    const messages = [
      ...earlier,
      ...(await loop.catch((error: unknown) => {
        throw withUsage(error, usageOf([...earlier, ...answered], priorRequests + requests.sent));
      })),
    ];
    const sent = priorRequests + requests.sent;
    // Every failed turn's outcome carries its failure, so a turn that ended in error needs no
    // second look; a cancelled turn leaves the run's signal aborted.
    const failure = requests.failure ?? repairs.exhausted;
    if (failure) throw withUsage(failure, usageOf(messages, sent));
    if (scope.signal.aborted) throw withUsage(scope.signal.reason, usageOf(messages, sent));
    const text = textOf(messages.findLast((m): m is AssistantMessage => (m as Message).role === 'assistant'));
    const usage = usageOf(messages, sent);
    if (gate.pending.length > 0) {
      const state = pausedState(conversation.systemPrompt, messages as Message[], gate.pending, sent);
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
    return { status: 'completed', text, messages, usage, runId: scope.runId, data };
  }
}

/**
 * Creates an agent. Its workload names come from its limiter, so a misspelt workload does
 * not compile.
 *
 * @example
 * const agent = createAgent({
 *   model: 'anthropic/claude-sonnet-4-5',
 *   concurrency: { limiter: claude, workload: 'background' },
 * }); // Agent<'interactive' | 'background'>
 */
export function createAgent<W extends string = never>(options: AgentOptions<W>): Agent<W> {
  return new Agent(options);
}
