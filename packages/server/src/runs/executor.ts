import { createHash, randomBytes } from 'node:crypto';
import type { Database } from '@sluice/postgres/database';
import {
  RunTimeoutError,
  type Agent,
  type ConcurrencyEventListener,
  type RunResult,
  type ToolEvent,
} from 'sluice';
import { MAX_KEY_LENGTH, systemClock, type Clock } from 'sluice/concurrency';
import type { SluiceConfig } from '../config.js';
import { agentFor, checkClasses, workloadOf } from '../config.js';
import { withoutInput } from '../ops/logging.js';
import { traceRun } from '../ops/tracing.js';
import type { ServerSettings } from '../settings.js';
import { tuning } from '../tuning.js';
import { finishRun, pauseRun, type Outcome, type Pause, type RunClass } from './lifecycle.js';
import type { RunEvents } from './events.js';
import { answerOf, historyMessages, promptOf, publicMessage } from './agent-io.js';
import { historyOf, newThreadMessages, threadLeaseMs } from '../threads/store.js';
import { resumption } from './approvals.js';
import { claimDefaultRun, claimDeferredRun } from './claims.js';
import { getRun, runsToStop, toApiRun, type RunRow } from './store.js';
import type { RunWaiters } from './waiters.js';
import { RunStreams, lastEventOf, type RunLog, type StreamEvent } from '../streams/index.js';

/** Why a local run was stopped before it ended by itself. */
type StopReason = 'cancel' | 'lost' | 'interrupted';

class StopSignal extends Error {
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

interface LocalRun {
  readonly controller: AbortController;
  readonly done: Promise<RunRow | undefined>;
}

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

const { watchMs: WATCH_MS, idlePollMs: IDLE_POLL_MS, maxClaimBackoffMs: MAX_BACKOFF_MS } = tuning;

/**
 * Runs agents for this process: inline runs on the request that carried them, queued runs on
 * workers that claim the oldest queued run of their class. Keeps the abort handle of every run
 * executing here, stops one when a cancel arrives from any process, and stops runs that are no
 * longer its own (a peer declared them lost), so nothing keeps spending after that.
 */
export class Executor {
  readonly node = `node_${randomBytes(6).toString('hex')}`;
  readonly #running = new Map<string, LocalRun>();
  /** Idle queue loops, each with the class of run it claims. */
  readonly #idle = new Map<() => void, RunClass>();
  /** Loops waiting out a database failure; woken only to stop. */
  readonly #backingOff = new Set<() => void>();
  readonly #loops: Promise<void>[] = [];
  #claiming = false;
  #pastDeadline = false;
  #watch: ReturnType<typeof setInterval> | undefined;
  #watching = false;
  /** Hear the slot events of every run executed here (metrics); a listener that throws is ignored. */
  readonly concurrencyListeners = new Set<ConcurrencyEventListener>();
  /** The stored events of every run executed (and admitted) here. */
  readonly streams: RunStreams;
  readonly #onConcurrency: ConcurrencyEventListener = (event) => {
    for (const listener of this.concurrencyListeners) {
      try {
        listener(event);
      } catch {
        // one broken listener must not keep the others from hearing the event
      }
    }
  };

  constructor(
    private readonly db: Database,
    private readonly config: SluiceConfig,
    private readonly settings: ServerSettings,
    private readonly waiters: RunWaiters,
    events: RunEvents,
    private readonly log: Log = () => undefined,
    private readonly clock: Clock = systemClock,
    options: { storeEvents?: boolean } = {},
  ) {
    // A config built without defineConfig is checked here, before any worker starts.
    checkClasses(config);
    this.streams = new RunStreams(db, events, clock, (message, fields) => log('warn', message, fields), {
      store: options.storeEvents ?? true,
    });
    events.on((event) => {
      if (event.kind === 'cancel') this.stop(event.id, 'cancel');
      // A queued run of that thread may go now.
      if (event.kind === 'thread') this.notify();
    });
  }

  /** Runs executing in this process now. */
  get active(): number {
    return this.#running.size;
  }

  /** The ids of the runs executing in this process now. */
  executing(): string[] {
    return [...this.#running.keys()];
  }

  /** Executes a run that is already `running` in the store for this process; resolves with its final row. */
  execute(run: RunRow, listener?: RunListener): Promise<RunRow | undefined> {
    const controller = new AbortController();
    // Past the drain deadline nothing starts: a request admitted while the drain began gets
    // its run ended `interrupted` at once, like the runs the drain cut short.
    if (this.#pastDeadline) controller.abort(new StopSignal('interrupted'));
    const done = this.#execute(run, controller.signal, listener).finally(() => {
      this.#running.delete(run.id);
      this.waiters.ended(run.id);
      if (run.thread_id !== null) {
        this.waiters.threadFreed(run.thread_id);
        this.notify();
      }
    });
    this.#running.set(run.id, { controller, done });
    this.#startWatch();
    return done;
  }

  async #execute(run: RunRow, signal: AbortSignal, listener?: RunListener): Promise<RunRow | undefined> {
    const log = await this.streams.open(run);
    const heard = this.#recorder(run, log, listener);
    heard.event('run.started', toApiRun(run));
    const outcome = await traceRun(run, () => this.#run(run, signal, heard));
    // Everything but the last event is stored before the end is: a reader that sees the run
    // ended has the rest (streams/follow.ts).
    await this.streams.flush().catch(() => undefined);
    const final = outcome
      ? await this.#persist(run, outcome)
      : await getRun(this.db, run.tenant, run.id).catch(() => undefined);
    // Undefined: the run was ended elsewhere (lost, or its end could not be recorded); say how it stands.
    const current = final ?? (await getRun(this.db, run.tenant, run.id).catch(() => undefined)) ?? run;
    heard.event(lastEventOf(current.status), toApiRun(current));
    await this.streams.flush().catch(() => undefined);
    return final;
  }

  /** The run's listener, each event stored (and given its id) before it is heard. */
  #recorder(run: RunRow, log: RunLog, listener: RunListener | undefined) {
    const event = (name: StreamEvent['event'], data: Record<string, unknown>, tool?: ToolEvent) => {
      const recorded = log.record(name, data);
      listener?.onEvent?.(recorded, tool);
    };
    return {
      event,
      onText: (text: string) => {
        event('message.delta', { run_id: run.id, text });
        listener?.onText?.(text);
      },
      onTool: (tool: ToolEvent) => {
        // The stream's data stays { run_id, tool_call_id, name }; the whole event (arguments,
        // result text) goes beside it for carriers that show them (AG-UI).
        const data = { run_id: run.id, tool_call_id: tool.toolCallId, name: tool.name };
        event(tool.type === 'started' ? 'tool.started' : 'tool.completed', data, tool);
        listener?.onTool?.(tool);
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
        events: { onText: listener?.onText, onTool: listener?.onTool, onConcurrency: this.#onConcurrency },
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
  async #persist(run: RunRow, outcome: Outcome | Pause): Promise<RunRow | undefined> {
    const deadline = this.clock.now() + this.settings.nodeStaleMs;
    for (let delay: number = tuning.persistRetryMs; ; delay = Math.min(delay * 2, tuning.maxPersistRetryMs)) {
      try {
        return (
          (outcome.status === 'requires_action'
            ? await pauseRun(this.db, run.id, this.node, outcome)
            : await finishRun(this.db, run.id, this.node, outcome)) ??
          (await getRun(this.db, run.tenant, run.id))
        );
      } catch (error) {
        if (this.clock.now() + delay > deadline) {
          this.log('error', 'could not record the end of a run', {
            run: run.id,
            status: outcome.status,
            error: String(error),
          });
          return undefined;
        }
        await new Promise((resolve) => this.clock.setTimeout(() => resolve(undefined), delay));
      }
    }
  }

  /** Stops a run executing in this process; false when it is not here. */
  stop(id: string, reason: StopReason): boolean {
    const entry = this.#running.get(id);
    if (!entry) return false;
    entry.controller.abort(new StopSignal(reason));
    return true;
  }

  /** The final row of a run executing here, once it ends. */
  settled(id: string): Promise<RunRow | undefined> | undefined {
    return this.#running.get(id)?.done;
  }

  /**
   * Queued runs were written: wake idle workers now instead of at their next poll. Given a
   * class, one idle loop of that class is woken per run: a loop that wakes for nothing costs a
   * transaction, and a burst of admissions must not make every worker claim in vain. Without
   * one (a thread freed, scheduled runs promoted, the workers stopping), every idle loop wakes.
   */
  notify(runClass?: RunClass, runs = 1): void {
    let left = runs;
    for (const [wake, loopClass] of [...this.#idle]) {
      if (runClass !== undefined && (loopClass !== runClass || left-- <= 0)) continue;
      wake();
    }
  }

  /** Starts the queue workers (after the server listens). */
  startWorkers(): void {
    this.#claiming = true;
    for (let i = 0; i < this.settings.runConcurrency; i++) {
      this.#loops.push(
        this.#loop('default', () => claimDefaultRun(this.db, this.node, threadLeaseMs(this.settings))),
      );
    }
    // Deferred work has workers of its own: a deferred backlog never takes interactive capacity.
    for (let i = 0; i < this.settings.deferredConcurrency; i++) {
      this.#loops.push(
        this.#loop('deferred', () =>
          claimDeferredRun(
            this.db,
            this.node,
            this.settings.deferredMaxRunningPerTenant,
            threadLeaseMs(this.settings),
          ),
        ),
      );
    }
  }

  /** Claim nothing more; the loops end after their current run. */
  async stopWorkers(): Promise<void> {
    this.#claiming = false;
    this.notify();
    for (const wake of [...this.#backingOff]) wake();
    await Promise.allSettled(this.#loops.splice(0));
  }

  /**
   * Resolves when every local run has ended, or after `timeoutMs`; returns the ids still
   * running. Runs that start meanwhile (a request admitted as the drain began) are waited for
   * too, and any run that would start after the deadline is interrupted at once.
   */
  async settle(timeoutMs: number): Promise<string[]> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<'deadline'>(
      (resolve) => (timer = setTimeout(() => resolve('deadline'), timeoutMs)),
    );
    while (this.#running.size > 0) {
      const outcome = await Promise.race([
        Promise.allSettled([...this.#running.values()].map((r) => r.done)),
        deadline,
      ]);
      if (outcome === 'deadline') break;
    }
    clearTimeout(timer);
    this.#pastDeadline = true;
    return [...this.#running.keys()];
  }

  /** Stops every local run for `reason` and waits until each has ended. */
  async stopAll(reason: StopReason): Promise<void> {
    const all = [...this.#running.values()];
    for (const { controller } of all) controller.abort(new StopSignal(reason));
    await Promise.allSettled(all.map((r) => r.done));
  }

  async close(): Promise<void> {
    await this.stopWorkers();
    clearInterval(this.#watch);
    this.#watch = undefined;
    await this.streams.close();
  }

  async #loop(runClass: RunClass, claim: () => Promise<RunRow | undefined>): Promise<void> {
    let failures = 0;
    while (this.#claiming) {
      let run: RunRow | undefined;
      try {
        run = await claim();
        failures = 0;
      } catch (error) {
        // The database is away: back off (with jitter, so a hundred loops do not knock on a
        // recovering server at once), then try again. The loop itself never ends on an error.
        if (failures++ === 0) this.log('warn', 'claiming a queued run failed', { error: String(error) });
      }
      if (run) {
        await this.execute(run).catch(() => undefined);
        continue;
      }
      const pause =
        failures === 0
          ? IDLE_POLL_MS
          : Math.min(IDLE_POLL_MS * 2 ** failures, MAX_BACKOFF_MS) * (0.5 + Math.random() / 2);
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          this.#idle.delete(wake);
          this.#backingOff.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, pause);
        // A notify wakes a healthy loop at once; a failing one keeps its backoff.
        if (failures === 0) this.#idle.set(wake, runClass);
        else this.#backingOff.add(wake);
      });
    }
  }

  /** While runs execute here, look at them now and then: canceled elsewhere, or not ours any more. */
  #startWatch(): void {
    if (this.#watch) return;
    this.#watch = setInterval(() => void this.#look(), WATCH_MS);
    this.#watch.unref();
  }

  async #look(): Promise<void> {
    if (this.#running.size === 0) {
      clearInterval(this.#watch);
      this.#watch = undefined;
      return;
    }
    if (this.#watching) return;
    this.#watching = true;
    try {
      for (const { id, reason } of await runsToStop(this.db, this.node, [...this.#running.keys()])) {
        if (this.stop(id, reason))
          this.log('info', `stopping run: ${reason === 'cancel' ? 'canceled' : 'no longer ours'}`, {
            run: id,
          });
      }
    } catch {
      // The database is away: the liveness check of the node decides when to give up.
    } finally {
      this.#watching = false;
    }
  }
}

/** A tenant as a limiter key: itself, or a digest of it past the keys' length limit. */
function tenantKey(tenant: string): string {
  return tenant.length <= MAX_KEY_LENGTH
    ? tenant
    : `sha256:${createHash('sha256').update(tenant).digest('hex')}`;
}
