import { randomUUID } from 'node:crypto';
import { runAgentLoop, type AgentEvent, type AgentMessage } from '@mariozechner/pi-agent-core';
import type { AssistantMessage, Message } from '@mariozechner/pi-ai';
import type { Clock } from '../concurrency/clock.js';
import { ConcurrencyConfigError, ConcurrencyError, type RequestLineage } from '../concurrency/errors.js';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import { resolveKey } from '../concurrency/options.js';
import { withLineage } from '../concurrency/slot.js';
import { resolveCredentials, resolveModel, type Credential, type ModelSpec } from '../models/model.js';
import { compactMessages } from './compaction.js';
import { toConversation, type ChatMessage, type Conversation } from './conversation.js';
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

export interface RunUsage {
  input: number;
  output: number;
  totalTokens: number;
  cost: number;
  /** Provider requests sent, retries and fallbacks included. */
  requests: number;
}

export interface RunResult<T = unknown> {
  text: string;
  /** The conversation of this run: the prompt, the assistant turns and the tool results (not `history`). */
  messages: unknown[];
  usage: RunUsage;
  runId: string;
  /** The final answer parsed and checked against `run({ schema })`; undefined without a schema. */
  data: T;
}

/**
 * A failed or cancelled run still consumed tokens: its error carries `usage` (what the provider
 * requests sent before the failure cost), so spend accounting can count it. Set on the error
 * object itself, not enumerable; an error that cannot take it (frozen, or not an object) is
 * thrown as it is.
 */
function withUsage(error: unknown, usage: RunUsage): unknown {
  if (error !== null && typeof error === 'object' && Object.isExtensible(error) && !('usage' in error)) {
    Object.defineProperty(error, 'usage', { value: usage, enumerable: false, configurable: true });
  }
  return error;
}

function usageOf(messages: readonly AgentMessage[], requests: number): RunUsage {
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

/** What `#start` checked and worked out of a run's options, for `#run`. */
interface RunPlan {
  readonly conversation: Conversation;
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

  /** Runs the agent to its final answer. */
  async run<T = unknown>(options: RunOptions<W>): Promise<RunResult<T>> {
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

  async #start(options: RunOptions<W>, onText: ((delta: string) => void) | undefined): Promise<RunResult> {
    // Everything the caller gave is checked before a slot is asked for or a request sent.
    const conversation = toConversation(
      { instructions: this.#options.instructions, prompt: options?.prompt, history: options?.history },
      this.#model,
      this.#runtime.clock.now(),
    );
    const bounds = runBounds(this.#runtime.bounds, options.bounds);
    const events = checkRunEvents(options.events);
    const timeoutMs =
      options.timeoutMs === undefined ? undefined : duration('timeoutMs', options.timeoutMs, { zero: true });
    const parent = runScope.getStore();
    const runId = randomUUID();
    const lineage = { runId, rootRunId: parent?.rootRunId ?? runId, parentRunId: parent?.runId };
    const { limiter, workload, key } = this.#concurrencyOf(options, parent, lineage);
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
    });
    try {
      const forward = forwardRunEvents(events, onText);
      return await runScope.run(scope, () => this.#run(scope, options, { conversation, bounds, forward }));
    } finally {
      close();
    }
  }

  /** The run's limiter and workload, checked before anything is sent. */
  #concurrencyOf(options: RunOptions<W>, parent: RunScope | undefined, lineage: RequestLineage) {
    const own = this.#options.concurrency?.limiter as ConcurrencyLimiter<string> | undefined;
    const limiter = own ?? parent?.limiter;
    // A child on its parent's limiter keeps its parent's workload unless the run picks one:
    // nesting cannot move work to another workload by accident.
    let workload =
      options.concurrency?.workload ??
      (limiter !== undefined && limiter === parent?.limiter
        ? parent.workload
        : this.#options.concurrency?.workload);
    if (options.concurrency?.workload !== undefined && !limiter) {
      throw new ConcurrencyConfigError('This agent has no limiter, so a run cannot pick a workload', {
        limiter: 'none',
        workload: options.concurrency.workload,
        ...lineage,
        field: 'concurrency.workload',
      });
    }
    if (limiter?.validateWorkload) {
      try {
        workload = limiter.validateWorkload(workload);
      } catch (error) {
        throw error instanceof ConcurrencyError ? withLineage(error, lineage) : error;
      }
    }
    // The key says who the work is for, whichever limiter a child uses: it is inherited.
    const key = options.concurrency?.key ?? parent?.key;
    if (options.concurrency?.key !== undefined) {
      resolveKey({ name: limiter?.name ?? 'none' }, options.concurrency.key, workload ?? 'default', lineage);
    }
    return { limiter, workload, key };
  }

  async #run(scope: RunScope, options: RunOptions<W>, plan: RunPlan): Promise<RunResult> {
    const { conversation, bounds, forward } = plan;
    const { compaction, clock } = this.#runtime;
    const tools = toAgentTools((this.#options.tools ?? []) as readonly Tool<never>[], scope, bounds);
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
    const messages = await runAgentLoop(
      conversation.prompts,
      { systemPrompt: conversation.systemPrompt, messages: conversation.history, tools },
      {
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
          return problem !== undefined && !repairs.take(problem);
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
      },
      (event) => {
        if (
          event.type === 'message_end' &&
          (event.message as Message).role === 'assistant' &&
          !prompts.has(event.message)
        ) {
          lastAssistant = event.message as AssistantMessage;
          answered.push(lastAssistant);
        }
        forward(event);
      },
      scope.signal,
      requests.stream,
    ).catch((error: unknown) => {
      throw withUsage(error, usageOf(answered, requests.sent));
    });
    // Every failed turn's outcome carries its failure, so a turn that ended in error needs no
    // second look; a cancelled turn leaves the run's signal aborted.
    const failure = requests.failure ?? repairs.exhausted;
    if (failure) throw withUsage(failure, usageOf(messages, requests.sent));
    if (scope.signal.aborted) throw withUsage(scope.signal.reason, usageOf(messages, requests.sent));
    const text = textOf(messages.findLast((m): m is AssistantMessage => (m as Message).role === 'assistant'));
    return { text, messages, usage: usageOf(messages, requests.sent), runId: scope.runId, data };
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
