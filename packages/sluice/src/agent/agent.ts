import { randomUUID } from 'node:crypto';
import { runAgentLoop, type AgentMessage, type AgentTool } from '@mariozechner/pi-agent-core';
import {
  validateToolArguments,
  type AssistantMessage,
  type Message,
  type TextContent,
  type ToolCall,
} from '@mariozechner/pi-ai';
import { ConcurrencyConfigError } from '../concurrency/errors.js';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import { resolveCredentials, resolveModel, type Credential, type ModelSpec } from '../models/model.js';
import { RunTimeoutError } from './errors.js';
import { createProviderRequest, type RetryOptions } from './provider-request.js';
import { runScope, type RunScope } from './scope.js';
import { Semaphore } from './semaphore.js';
import type { JsonSchema, Tool } from './tool.js';
import { compactMessages, type CompactionOptions } from './compaction.js';

/** Bounds on what one run may do. */
export interface RunBounds {
  /** Most tool calls running at once in a run. @default 10 */
  maxParallelToolCalls?: number;
  /** Longest one tool call may run; it then fails with an error result. No default. */
  toolTimeoutMs?: number;
  /** Longest one provider request may take once sent. No default. */
  turnTimeoutMs?: number;
}

export interface AgentOptions<W extends string> {
  model: ModelSpec;
  /** The system prompt. */
  instructions?: string;
  tools?: readonly Tool<never>[] | readonly Tool<Record<string, unknown>>[];
  /** One API key, or several tried in order. Default: the provider's usual environment variable. */
  credentials?: Credential | Credential[];
  /** The limiter every provider request of this agent takes a slot from, and its workload. */
  concurrency?: { limiter: ConcurrencyLimiter<W>; workload?: NoInfer<W> };
  events?: { onConcurrency?: ConcurrencyEventListener };
  bounds?: RunBounds;
  retry?: RetryOptions;
  /**
   * Corrective turns allowed in a run: after a call to an unknown tool, arguments that fail a
   * tool's schema, or a final answer that fails `run({ schema })`. Each is a provider request
   * with its own slot. @default 2
   */
  maxRepairs?: number;
  /** Summarise older messages when the conversation grows too large (or the provider says so). */
  compaction?: CompactionOptions;
}

export interface RunOptions<W extends string> {
  prompt: string;
  /** The run's whole time budget, slot waits included. A child stays within its parent's. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** A workload of the agent's limiter for this run. */
  concurrency?: { workload: W };
  events?: { onConcurrency?: ConcurrencyEventListener };
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
  /** The conversation of this run: the prompt, the assistant turns and the tool results. */
  messages: unknown[];
  usage: RunUsage;
  runId: string;
  /** The final answer parsed and checked against `run({ schema })`; undefined without a schema. */
  data: T;
}

const defaults = Object.freeze({
  maxParallelToolCalls: 10,
  maxRetries: 3,
  baseDelayMs: 500,
  maxDelayMs: 30_000,
  maxRepairs: 2,
});

/** The model kept answering in a form the run cannot use, past `maxRepairs` corrective turns. */
export class RepairLimitError extends Error {
  override readonly name = 'RepairLimitError';
  constructor(
    readonly runId: string,
    readonly repairs: number,
    readonly lastProblem: string,
  ) {
    super(`Run ${runId} gave up after ${repairs} corrective turns: ${lastProblem}`);
  }
}

function textOf(message: AssistantMessage | undefined): string {
  if (!message) return '';
  return message.content
    .filter((c): c is TextContent => c.type === 'text')
    .map((c) => c.text)
    .join('');
}

/** Models often wrap JSON in a Markdown fence; take what is inside. */
function stripFence(text: string): string {
  const match = /^\s*```(?:json)?\s*\n([\s\S]*?)\n?```\s*$/.exec(text);
  return match ? match[1]! : text;
}

function toolResultContent(value: unknown): TextContent[] {
  const text = typeof value === 'string' ? value : (JSON.stringify(value) ?? 'null');
  return [{ type: 'text', text }];
}

/**
 * An agent: a model, instructions and tools, whose every provider request takes a slot from
 * its limiter (or, when it runs inside another agent's tool, from its parent's). `W` is the
 * union of its limiter's workload names; an agent without a limiter is `Agent<never>`.
 */
export { RunTimeoutError };

export class Agent<W extends string = never> {
  readonly #options: AgentOptions<W>;
  readonly #model: ReturnType<typeof resolveModel>;
  readonly #credentials: Credential[];
  readonly #bounds: Required<Pick<RunBounds, 'maxParallelToolCalls'>> & RunBounds;

  constructor(options: AgentOptions<W>) {
    this.#options = options;
    this.#model = resolveModel(options.model);
    this.#credentials = resolveCredentials(this.#model, options.credentials);
    const max = options.bounds?.maxParallelToolCalls ?? defaults.maxParallelToolCalls;
    if (!Number.isSafeInteger(max) || max < 1) {
      throw new TypeError(
        `Expected \`bounds.maxParallelToolCalls\` to be a whole number >= 1, got \`${max}\``,
      );
    }
    for (const key of ['toolTimeoutMs', 'turnTimeoutMs'] as const) {
      const v = options.bounds?.[key];
      if (v !== undefined && (typeof v !== 'number' || !(v > 0))) {
        throw new TypeError(`Expected \`bounds.${key}\` to be a number > 0, got \`${String(v)}\``);
      }
    }
    this.#bounds = { ...options.bounds, maxParallelToolCalls: max };
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
    if (typeof options?.prompt !== 'string') throw new TypeError('Expected `prompt` to be a string');
    const parent = runScope.getStore();
    const runId = randomUUID();
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
        runId,
        field: 'concurrency.workload',
      });
    }
    if (limiter?.validateWorkload) {
      try {
        workload = limiter.validateWorkload(workload);
      } catch (error) {
        if (error instanceof ConcurrencyConfigError)
          Object.assign(error, { runId, rootRunId: parent?.rootRunId ?? runId, parentRunId: parent?.runId });
        throw error;
      }
    }

    const startedAt = Date.now();
    let deadline = options.timeoutMs === undefined ? undefined : startedAt + options.timeoutMs;
    if (parent?.deadline !== undefined) deadline = Math.min(deadline ?? Infinity, parent.deadline);
    const controller = new AbortController();
    const cleanups: (() => void)[] = [];
    const link = (signal: AbortSignal | undefined) => {
      if (!signal) return;
      if (signal.aborted) return controller.abort(signal.reason);
      const onAbort = () => controller.abort(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      cleanups.push(() => signal.removeEventListener('abort', onAbort));
    };
    link(options.signal);
    link(parent?.signal);
    if (deadline !== undefined) {
      const timer = setTimeout(
        () => controller.abort(new RunTimeoutError(runId, deadline! - startedAt)),
        Math.max(0, deadline - startedAt),
      );
      cleanups.push(() => clearTimeout(timer));
    }

    const scope: RunScope = {
      runId,
      rootRunId: parent?.rootRunId ?? runId,
      parentRunId: parent?.runId,
      limiter,
      workload,
      signal: controller.signal,
      deadline,
      listeners: [
        ...(parent?.listeners ?? []),
        ...(this.#options.events?.onConcurrency ? [this.#options.events.onConcurrency] : []),
        ...(options.events?.onConcurrency ? [options.events.onConcurrency] : []),
      ],
    };
    try {
      return await runScope.run(scope, () => this.#run(scope, options, onText));
    } finally {
      for (const cleanup of cleanups) cleanup();
    }
  }

  async #run(
    scope: RunScope,
    options: RunOptions<W>,
    onText: ((delta: string) => void) | undefined,
  ): Promise<RunResult> {
    const prompt = options.prompt;
    let failure: Error | undefined;
    let requests = 0;
    const semaphore = new Semaphore(this.#bounds.maxParallelToolCalls);
    const tools: AgentTool[] = (this.#options.tools ?? []).map((t) => ({
      name: t.name,
      label: t.name,
      description: t.description,
      parameters: t.jsonSchema as AgentTool['parameters'],
      execute: (toolCallId, params, signal) =>
        semaphore.run(async () => {
          const signals = [signal ?? scope.signal];
          if (this.#bounds.toolTimeoutMs !== undefined)
            signals.push(AbortSignal.timeout(this.#bounds.toolTimeoutMs));
          const toolSignal = AbortSignal.any(signals);
          // The tool's own promise races its bounds: a tool that ignores its signal still
          // cannot hold the run past its timeout.
          const result = await new Promise<unknown>((resolve, reject) => {
            const onAbort = () =>
              reject(
                scope.signal.aborted
                  ? scope.signal.reason
                  : new Error(`Tool ${t.name} passed toolTimeoutMs (${this.#bounds.toolTimeoutMs} ms)`),
              );
            if (toolSignal.aborted) return onAbort();
            toolSignal.addEventListener('abort', onAbort, { once: true });
            Promise.resolve()
              .then(() =>
                (t.execute as (a: unknown, c: unknown) => unknown)(params, {
                  signal: toolSignal,
                  runId: scope.runId,
                  toolCallId,
                }),
              )
              .then(resolve, reject)
              .finally(() => toolSignal.removeEventListener('abort', onAbort));
          });
          return { content: toolResultContent(result), details: undefined };
        }),
    }));

    const streamFn = createProviderRequest({
      scope,
      credentials: this.#credentials,
      retry: {
        maxRetries: this.#options.retry?.maxRetries ?? defaults.maxRetries,
        baseDelayMs: this.#options.retry?.baseDelayMs ?? defaults.baseDelayMs,
        maxDelayMs: this.#options.retry?.maxDelayMs ?? defaults.maxDelayMs,
      },
      turnTimeoutMs: this.#bounds.turnTimeoutMs,
      fail: (error) => (failure ??= error),
      onRequest: () => requests++,
      // The provider says the conversation is too long: summarise it for the retried request,
      // and compact the run's own conversation before its next turn.
      onOverflow: async (context) => {
        compactNext = true;
        return { ...context, messages: (await summarize(context.messages as AgentMessage[])) as Message[] };
      },
    });

    const maxRepairs = this.#options.maxRepairs ?? defaults.maxRepairs;
    let repairs = 0;
    let repairFailure: RepairLimitError | undefined;
    let data: unknown;
    let lastAssistant: AssistantMessage | undefined;
    const known = new Map(tools.map((t) => [t.name, t]));
    // What is wrong with a turn's tool calls, if anything: an unknown tool or arguments that
    // fail its schema. The loop answers each with an error result, which is the correction.
    const toolCallProblem = (message: AssistantMessage): string | undefined => {
      for (const call of message.content.filter((c): c is ToolCall => c.type === 'toolCall')) {
        const t = known.get(call.name);
        if (!t) return `unknown tool \`${call.name}\``;
        try {
          validateToolArguments(t, call);
        } catch (error) {
          return `arguments of \`${call.name}\` do not match its schema: ${(error as Error).message}`;
        }
      }
      return undefined;
    };
    const countRepair = (problem: string): boolean => {
      if (repairs >= maxRepairs) {
        repairFailure ??= new RepairLimitError(scope.runId, repairs, problem);
        return false;
      }
      repairs++;
      return true;
    };

    const compaction = this.#options.compaction;
    let compactNext = false;
    const summarize = async (messages: AgentMessage[]) =>
      compactMessages(messages as Message[], {
        keepLast: compaction?.keepLast,
        summarize: async (summaryContext) => {
          const message = await streamFn(this.#model, summaryContext, {}).result();
          if (message.stopReason === 'error' || message.stopReason === 'aborted') {
            throw failure ?? new Error(message.errorMessage ?? 'the summary request failed');
          }
          return textOf(message);
        },
      });

    const prompts: AgentMessage[] = [{ role: 'user', content: prompt, timestamp: Date.now() }];
    const messages = await runAgentLoop(
      prompts,
      { systemPrompt: this.#options.instructions ?? '', messages: [], tools },
      {
        model: this.#model,
        convertToLlm: (m) => m as Message[],
        toolExecution: 'parallel',
        transformContext: async (current) => {
          const tooLarge =
            compaction?.maxChars !== undefined && JSON.stringify(current).length > compaction.maxChars;
          if (!tooLarge && !compactNext) return current;
          compactNext = false;
          try {
            return (await summarize(current)) as AgentMessage[];
          } catch (error) {
            failure ??= error as Error;
            return current;
          }
        },
        shouldStopAfterTurn: ({ message }) => {
          if (failure) return true;
          const problem =
            (message as AssistantMessage).role === 'assistant'
              ? toolCallProblem(message as AssistantMessage)
              : undefined;
          return problem !== undefined && !countRepair(problem);
        },
        getFollowUpMessages: async () => {
          // The final answer: with a schema, it must be JSON that matches it.
          if (!options.schema || failure || !lastAssistant || lastAssistant.stopReason !== 'stop') return [];
          const text = textOf(lastAssistant);
          let problem: string;
          try {
            data = validateToolArguments(
              { name: 'answer', description: 'the final answer', parameters: options.schema as never },
              { type: 'toolCall', id: 'answer', name: 'answer', arguments: JSON.parse(stripFence(text)) },
            );
            return [];
          } catch (error) {
            problem =
              error instanceof SyntaxError
                ? `the answer is not JSON (${error.message})`
                : (error as Error).message;
          }
          data = undefined;
          if (!countRepair(`final answer: ${problem}`)) return [];
          return [
            {
              role: 'user',
              content: `Your answer cannot be used: ${problem}. Reply with only a JSON value that matches this JSON Schema: ${JSON.stringify(options.schema)}`,
              timestamp: Date.now(),
            },
          ];
        },
      },
      (event) => {
        if (event.type === 'message_end' && (event.message as Message).role === 'assistant') {
          lastAssistant = event.message as AssistantMessage;
        }
        if (onText && event.type === 'message_update' && event.assistantMessageEvent.type === 'text_delta') {
          onText(event.assistantMessageEvent.delta);
        }
      },
      scope.signal,
      streamFn,
    );
    if (repairFailure && !failure) failure = repairFailure;
    if (failure) throw failure;
    if (scope.signal.aborted) throw scope.signal.reason;
    const assistants = messages.filter((m): m is AssistantMessage => (m as Message).role === 'assistant');
    const last = assistants.at(-1);
    if (last?.stopReason === 'error') throw new Error(last.errorMessage ?? 'the run failed');
    const usage = assistants.reduce(
      (sum, m) => ({
        input: sum.input + m.usage.input,
        output: sum.output + m.usage.output,
        totalTokens: sum.totalTokens + m.usage.totalTokens,
        cost: sum.cost + m.usage.cost.total,
        requests: sum.requests,
      }),
      { input: 0, output: 0, totalTokens: 0, cost: 0, requests },
    );
    return { text: textOf(last), messages, usage, runId: scope.runId, data };
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
