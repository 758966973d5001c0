import { createHash } from 'node:crypto';
import type { Database } from '@sluice/postgres/database';
import {
  RunTimeoutError,
  type Agent,
  type ConcurrencyEventListener,
  type RunResult,
  type ToolEvent,
} from 'sluice';
import { MAX_KEY_LENGTH, type Clock } from 'sluice/concurrency';
import type { SluiceConfig } from '../config.js';
import { agentFor, workloadOf } from '../config.js';
import { withoutInput } from '../ops/logging.js';
import { traceRun } from '../ops/tracing.js';
import type { ServerSettings } from '../settings.js';
import { tuning } from '../tuning.js';
import { finishRun, pauseRun, type Outcome, type Pause } from './lifecycle.js';
import { answerOf, historyMessages, promptOf, publicMessage } from './agent-io.js';
import { historyOf, newThreadMessages } from '../threads/store.js';
import { resumption } from './approvals.js';
import { getRun, toApiRun, type RunRow } from './store.js';
import {
  lastEventOf,
  type EventRow,
  type LastEvent,
  type RunLog,
  type RunStreams,
  type StreamEvent,
} from '../streams/index.js';

/**
 * Why a local run was stopped before it ended by itself; `refused`: a run started before its
 * admission answered was not admitted (runs/early-start.ts).
 */
export type StopReason = 'cancel' | 'lost' | 'interrupted' | 'refused';

/** The abort reason of a run stopped from outside (the executor's `stop`). */
export class StopSignal extends Error {
  constructor(readonly reason: StopReason) {
    super(`run stopped: ${reason}`);
  }
}

/** What a caller streaming a local run hears while it executes. */
export interface RunListener {
  onText?(delta: string): void;
  onTool?(event: ToolEvent): void;
  /**
   * Each event of the run's stream as it is stored, with its id: `run.started`, the deltas
   * and tool calls, then the one that ends the stream (`tool` is the whole tool event).
   */
  onEvent?(event: StreamEvent, tool?: ToolEvent): void;
}

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

export interface RunExecutionDeps {
  db: Database;
  config: SluiceConfig;
  settings: ServerSettings;
  streams: RunStreams;
  log: Log;
  clock: Clock;
  /** This process's worker id: the fence of every end it writes. */
  node: string;
  onConcurrency: ConcurrencyEventListener;
}

/**
 * The execution of one run on this process: its stream opened and `run.started` told, the
 * agent run (or resumed) with the run's history, bounds and limiter key, the outcome written
 * (fenced by this process's worker id, retried while the database is away), and the event
 * that ends its stream. Which runs execute, and stopping them, is the executor's (executor.ts).
 */
export class RunExecution {
  private readonly db: Database;
  private readonly config: SluiceConfig;
  private readonly settings: ServerSettings;
  private readonly streams: RunStreams;
  private readonly log: Log;
  private readonly clock: Clock;
  private readonly node: string;
  private readonly onConcurrency: ConcurrencyEventListener;

  constructor(deps: RunExecutionDeps) {
    this.db = deps.db;
    this.config = deps.config;
    this.settings = deps.settings;
    this.streams = deps.streams;
    this.log = deps.log;
    this.clock = deps.clock;
    this.node = deps.node;
    this.onConcurrency = deps.onConcurrency;
  }

  /**
   * Executes a run that is `running` for this process; resolves with its final row. With
   * `admission`, the run started before its admission answered (runs/early-start.ts): `run` is
   * its provisional row, its events are held until the admitted row comes, and a refusal
   * (undefined) ends it with nothing written or told.
   */
  async execute(
    run: RunRow,
    signal: AbortSignal,
    listener?: RunListener,
    admission?: Promise<RunRow | undefined>,
  ): Promise<RunRow | undefined> {
    const log = await this.streams.open(run);
    const heard = this.#recorder(run, log, listener, admission !== undefined);
    if (admission) {
      // Registered first: the held events go out the moment admission answers, before anything
      // this method does once the agent is done.
      void admission
        .then((admitted) => (admitted ? heard.open(toApiRun(admitted)) : heard.drop()))
        .catch((error: unknown) =>
          // A front's listener that threw while the held events went out: logged, since
          // nothing waits on this to reject with it.
          this.log('warn', 'a run listener failed', { run: run.id, error: String(error) }),
        );
    } else heard.event('run.started', toApiRun(run));
    const outcome = await traceRun(run, () => this.#run(run, signal, heard));
    if (admission) {
      const admitted = await admission;
      if (!admitted) return undefined;
      run = admitted;
    }
    // The outcome is known: nothing more is told but the last event.
    heard.close();
    // The events not written yet go in the statement that writes the end (one round trip, not a
    // flush and then the end), and so does the last one when that statement ends the run: a
    // reader that sees the run ended has its whole stream (streams/follow.ts). A paused run's
    // last event, and that of a run ended elsewhere, are flushed after it.
    let final: RunRow | undefined;
    let storedLast = false;
    if (outcome) {
      // A paused run's last event is flushed after it, as is every event when none are stored.
      const lastEventId =
        outcome.status === 'requires_action' || !this.streams.storing ? undefined : log.next;
      const ended = await this.#persist(run, outcome, await this.streams.takePending(run.id), lastEventId);
      final = ended?.row;
      storedLast = ended?.wrote === true && lastEventId !== undefined;
    } else {
      await this.streams.flush().catch(() => undefined);
      final = await getRun(this.db, run.tenant, run.id).catch(() => undefined);
    }
    // Undefined: the run was ended elsewhere (lost, or its end could not be recorded); say how it stands.
    const current = final ?? (await getRun(this.db, run.tenant, run.id).catch(() => undefined)) ?? run;
    heard.last(lastEventOf(current.status), toApiRun(current), storedLast);
    // Otherwise the last event is written as soon as the response's last bytes are out, not
    // before them: a reader that comes meanwhile waits for it (or, past the grace, makes it from
    // the row).
    if (!storedLast) this.streams.flushSoon();
    return final;
  }

  /**
   * The run's listener, each event stored (and given its id) before it is heard. Held, it keeps
   * what it is told until `open` (which tells `run.started` first) or `drop`.
   */
  #recorder(run: RunRow, log: RunLog, listener: RunListener | undefined, holding = false) {
    let held: (() => void)[] | undefined = holding ? [] : undefined;
    let dropped = false;
    let closed = false;
    const tellAny = (what: () => void) => {
      if (dropped) return;
      if (held) held.push(what);
      else what();
    };
    // After `close` (the outcome is known) only the last event is told: its id is the one the
    // statement writing the end was given.
    const tell = (what: () => void) => {
      if (!closed) tellAny(what);
    };
    const event = (name: StreamEvent['event'], data: Record<string, unknown>, tool?: ToolEvent) =>
      tell(() => {
        const recorded = log.record(name, data);
        listener?.onEvent?.(recorded, tool);
      });
    return {
      event,
      open: (started: Record<string, unknown>) => {
        const waiting = held ?? [];
        held = undefined;
        event('run.started', started);
        for (const what of waiting) what();
      },
      drop: () => {
        // What comes after a refusal is dropped too: the agent may still be stopping.
        dropped = true;
        held = undefined;
      },
      close: () => {
        closed = true;
      },
      /** The event that ends the stream; `stored`: the statement that wrote the run's end stored it. */
      last: (name: LastEvent, data: Record<string, unknown>, stored: boolean) =>
        tellAny(() => {
          const recorded = stored ? log.ended(name, data) : log.record(name, data);
          listener?.onEvent?.(recorded);
        }),
      onText: (text: string) => {
        event('message.delta', { run_id: run.id, text });
        tell(() => listener?.onText?.(text));
      },
      onTool: (tool: ToolEvent) => {
        // The stream's data stays { run_id, tool_call_id, name }; the whole event (arguments,
        // result text) goes beside it for carriers that show them (AG-UI).
        const data = { run_id: run.id, tool_call_id: tool.toolCallId, name: tool.name };
        event(tool.type === 'started' ? 'tool.started' : 'tool.completed', data, tool);
        tell(() => listener?.onTool?.(tool));
      },
    };
  }

  /** The agent's result as an outcome to write; undefined when someone else has ended the run. */
  async #run(run: RunRow, signal: AbortSignal, listener?: RunListener): Promise<Outcome | Pause | undefined> {
    const agent = agentFor(this.config, run.tenant, run.agent);
    if (!agent) {
      return {
        status: 'failed',
        error: { type: 'agent_error', message: `The agent \`${run.agent}\` is not served here` },
      };
    }
    const config = run.config ?? {};
    // A held run's own timeout, when it is shorter than the ceiling of every run.
    const heldTimeout =
      config.timeout_ms !== undefined && config.timeout_ms < this.settings.maxDurationMs
        ? config.timeout_ms
        : undefined;
    try {
      const history = run.thread_id === null ? [] : await historyOf(this.db, run.thread_id);
      // Each class's provider requests go in its workload of the agent's limiter (config.classes).
      const workload = workloadOf(this.config, run.class, agent);
      const options = {
        history: await historyMessages(this.db, run.tenant, history),
        signal,
        // Tenants sharing a provider limiter take turns in its queue (fair queuing by key).
        concurrency: { key: tenantKey(run.tenant), ...(workload === undefined ? {} : { workload }) },
        timeoutMs: heldTimeout ?? this.settings.maxDurationMs,
        bounds: {
          maxParallelToolCalls: config.max_parallel_tool_calls ?? this.settings.maxParallelToolCalls,
          toolTimeoutMs: config.tool_timeout_ms,
          turnTimeoutMs: config.turn_timeout_ms,
        },
        events: { onText: listener?.onText, onTool: listener?.onTool, onConcurrency: this.onConcurrency },
      };
      const result = run.resuming
        ? await this.#resume(agent as Agent<string>, run, options)
        : await (agent as Agent<string>).run({
            prompt: await promptOf(this.db, run.tenant, run.input),
            ...options,
          });
      if (result.status === 'requires_action') {
        return {
          status: 'requires_action',
          pending: result.pendingToolCalls,
          state: result.state,
          usage: result.usage,
        };
      }
      // An agent that gives no conversation back (a stand-in in a config) answers with its text.
      const text = Array.isArray(result.messages) ? answerOf(run.input, result.messages) : result.text;
      return {
        status: 'succeeded',
        output: result.data === undefined ? { text } : { text, data: result.data },
        usage: result.usage,
        threadMessages: run.thread_id === null ? undefined : newThreadMessages(run.input, text),
      };
    } catch (error) {
      const usage = (error as { usage?: unknown }).usage;
      if (signal.aborted) {
        const reason = signal.reason instanceof StopSignal ? signal.reason.reason : 'cancel';
        if (reason === 'cancel') return { status: 'canceled', usage };
        // An interrupted run is usually written so by the drain already (then this write is a
        // no-op); one stopped before it started is written here. A lost run is someone else's.
        if (reason === 'interrupted') {
          return {
            status: 'failed',
            error: {
              type: 'interrupted',
              message: 'the server stopped before this run finished; start it again',
            },
            usage,
          };
        }
        return undefined;
      }
      if (error instanceof RunTimeoutError && heldTimeout !== undefined) {
        return {
          status: 'failed',
          error: { type: 'timeout', message: `The run passed its timeout of ${heldTimeout} ms` },
          usage,
        };
      }
      if (error instanceof RunTimeoutError) {
        return {
          status: 'failed',
          error: {
            type: 'max_duration_exceeded',
            message: 'The run passed AGENT_BACKGROUND_MAX_DURATION_MS',
          },
          usage,
        };
      }
      this.log('warn', 'agent failed', {
        run: run.id,
        error: withoutInput(error instanceof Error ? error.message : String(error), run.input),
      });
      return {
        status: 'failed',
        error: { type: 'agent_error', message: publicMessage(error, run.id) },
        usage,
      };
    }
  }

  /** Continues a paused run from its stored state with the answers its resume gave. */
  async #resume(
    agent: Agent<string>,
    run: RunRow,
    options: Omit<Parameters<Agent<string>['resume']>[0], 'paused' | 'decisions'>,
  ): Promise<RunResult> {
    const from = await resumption(this.db, run.id);
    if (!from) throw new Error(`run ${run.id} was resumed but its paused state is gone`);
    if (typeof agent.resume !== 'function') throw new Error(`the agent \`${run.agent}\` cannot resume runs`);
    return agent.resume({ ...options, ...from });
  }

  /**
   * Writes the outcome. A database that is away is tried again with backoff for as long as the
   * run could still be ours (until peers would declare it lost): the result is not given up
   * for a blip, and a write that fails is never turned into a different outcome.
   */
  async #persist(
    run: RunRow,
    outcome: Outcome | Pause,
    events: EventRow[],
    lastEventId: number | undefined,
  ): Promise<{ row: RunRow | undefined; wrote: boolean } | undefined> {
    const deadline = this.clock.now() + this.settings.nodeStaleMs;
    for (let delay: number = tuning.persistRetryMs; ; delay = Math.min(delay * 2, tuning.maxPersistRetryMs)) {
      try {
        const ended =
          outcome.status === 'requires_action'
            ? await pauseRun(this.db, run.id, this.node, outcome, events)
            : await finishRun(this.db, run.id, this.node, outcome, events, lastEventId);
        // Not written by this statement: ended elsewhere, or by an attempt whose answer was lost.
        return ended
          ? { row: ended, wrote: true }
          : { row: await getRun(this.db, run.tenant, run.id), wrote: false };
      } catch (error) {
        if (this.clock.now() + delay > deadline) {
          this.log('error', 'could not record the end of a run', {
            run: run.id,
            status: outcome.status,
            error: String(error),
          });
          // Its events go back to the writer, which keeps trying (a row written already is kept).
          this.streams.restore(events);
          return undefined;
        }
        await new Promise((resolve) => this.clock.setTimeout(() => resolve(undefined), delay));
      }
    }
  }
}

/** A tenant as a limiter key: itself, or a digest of it past the keys' length limit. */
function tenantKey(tenant: string): string {
  return tenant.length <= MAX_KEY_LENGTH
    ? tenant
    : `sha256:${createHash('sha256').update(tenant).digest('hex')}`;
}
