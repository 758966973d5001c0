import { randomUUID } from 'node:crypto';
import type { AgentEvent } from '@mariozechner/pi-agent-core';
import type { Context, Message } from '@mariozechner/pi-ai';
import { ConcurrencyConfigError } from '../concurrency/errors.js';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import { resolveCredentials, resolveModel, type Credential } from '../models/model.js';
import type { AgentOptions, ResumeOptions, RunOptions } from './agent-options.js';
import { ApprovalGate, decidedResults } from './approvals.js';
import { RunCompaction } from './compaction.js';
import { duration, resolveRuntimeOptions, runBounds, type ResolvedRuntimeOptions } from './options.js';
import { RepairCounter } from './repairs.js';
import { usageOf, withUsage, type RunResult } from './results.js';
import { runResult } from './run-end.js';
import { checkRunEvents, forwardRunEvents } from './run-events.js';
import { RunLoop } from './run-loop.js';
import { checkOutputTokens, runConcurrency, runConversation, type ConversationPlan } from './run-plan.js';
import { RunRequests } from './run-requests.js';
import { openScope, runFields, runScope, type RunScope } from './scope.js';
import { textStream, type TextStream } from './text-stream.js';
import { toAgentTools } from './tool-calls.js';
import type { Tool } from './tool.js';
import { RunTrace } from './tracing.js';

export type { AgentOptions, ResumeOptions, RunOptions } from './agent-options.js';
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
    if (options.concurrency?.outputTokens !== undefined) {
      checkOutputTokens(options.concurrency.outputTokens, limiter?.name ?? 'none');
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

  /** The API of the agent's model (`'openai-completions'`, `'anthropic-messages'`, ...): a server loads its provider code when it starts. */
  get modelApi(): string {
    return this.#model.api;
  }

  /** What the agent's model reads (`'text'`, and `'image'` when it takes images): a server checks a run's input against it. */
  get modelInput(): readonly ('text' | 'image')[] {
    return this.#model.input;
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
  stream(options: RunOptions<W>): TextStream {
    return textStream((onText) => this.#start(options, onText));
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
    const { limiter, workload, key, outputTokens } = runConcurrency(
      this.#options.concurrency as
        { limiter: ConcurrencyLimiter<string>; workload?: string; outputTokens?: number } | undefined,
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
      outputTokens,
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
    const { clock } = this.#runtime;
    const own = (this.#options.tools ?? []) as readonly Tool<never>[];
    const tools = toAgentTools(own, scope, bounds, (id) => gate.isPending(id));
    const gate = new ApprovalGate(own, tools);
    const repairs = new RepairCounter(this.#runtime.maxRepairs, runFields(scope));
    const compaction = new RunCompaction({
      ...this.#runtime.compaction,
      now: () => clock.now(),
      summarize: (context): Promise<string> => requests.text(this.#model, context),
    });
    const requests = new RunRequests({
      scope,
      credentials: this.#credentials,
      retry: this.#runtime.retry,
      turnTimeoutMs: bounds.turnTimeoutMs,
      onOverflow: (context): Promise<Context> => compaction.overflowed(context),
    });
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
    const loop = new RunLoop({
      scope,
      model: this.#model,
      conversation,
      tools,
      gate,
      repairs,
      requests,
      compaction,
      schema: options.schema,
      forward,
      clock,
    });
    const ran = await loop.run(resume ? earlier : undefined).catch((error: unknown) => {
      throw withUsage(error, usageOf([...earlier, ...loop.answered], priorRequests + requests.sent));
    });
    return runResult({
      scope,
      systemPrompt: conversation.systemPrompt,
      messages: [...earlier, ...ran],
      sent: priorRequests + requests.sent,
      failure: requests.failure ?? repairs.exhausted,
      gate,
      data: loop.data,
    });
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
