import type { FastifyReply } from 'fastify';
import { HttpError, badRequest, draining, notFound, refusalError, shown } from '../http/errors.js';
import { placeKeys } from '../cache/places.js';
import { admitRun, userRetryAfterMs, type Refusal, type WithRun } from '../runs/admission.js';
import type { RunClass } from '../runs/lifecycle.js';
import { getRun, newRunId, type NewRun, type RunConfig, type RunRow } from '../runs/store.js';
import type { ServerSettings } from '../settings.js';
import type { Principal } from '../store/tokens.js';
import { holdThread, threadRequiresAction, type OnBusy } from '../threads/hold.js';
import { getThread, threadLeaseMs, unlockThread } from '../threads/store.js';
import type { RouteContext } from './context.js';

/**
 * Creating a run, shared by every route that does (the runs API, the OpenAI endpoints): the
 * run's bounds, its thread, and the order of the checks of a held run (the user's place, the
 * thread, admission), with every place given back when a later check refuses. Routes render
 * the rows they get back in their own shapes.
 */

/** Bounds a client may send with a run (`config`). */
export interface ClientConfig {
  timeout_ms?: number | null;
  tool_timeout_ms?: number | null;
  turn_timeout_ms?: number | null;
  max_parallel_tool_calls?: number;
}

/** The smaller of two optional limits, where null, undefined and 0 mean "none". */
function tighter(a: number | null | undefined, b: number | null | undefined): number | undefined {
  const set = [a, b].filter((v): v is number => typeof v === 'number' && v > 0);
  return set.length === 0 ? undefined : Math.min(...set);
}

/**
 * The bounds a run is admitted with. A client can tighten the server's, never loosen them: its
 * `max_parallel_tool_calls` and `timeout_ms` are lowered to the server's values, and the run
 * timeout (`runs.timeoutMs`) applies to held runs whatever the client sends.
 */
export function runConfig(
  given: ClientConfig | undefined,
  settings: ServerSettings,
  held: boolean,
): RunConfig {
  const config: RunConfig = {
    max_parallel_tool_calls: Math.min(
      given?.max_parallel_tool_calls ?? settings.maxParallelToolCalls,
      settings.maxParallelToolCalls,
    ),
  };
  const timeout = tighter(given?.timeout_ms, held ? settings.runTimeoutMs : undefined);
  if (timeout !== undefined) config.timeout_ms = timeout;
  const tool = tighter(given?.tool_timeout_ms, undefined);
  if (tool !== undefined) config.tool_timeout_ms = tool;
  const turn = tighter(given?.turn_timeout_ms, undefined);
  if (turn !== undefined) config.turn_timeout_ms = turn;
  return config;
}

/** A signal that aborts when the client goes away before it was answered (or has already gone). */
export function clientGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  const left = () => {
    if (!reply.raw.writableFinished) controller.abort();
  };
  if (reply.raw.destroyed) left();
  else reply.raw.once('close', left);
  return controller.signal;
}

/**
 * `clientGone`, made when first asked for: a request refused before it needs the signal (most
 * 429s) makes no AbortController (a tenth of a refusal's cost in the server).
 */
export function lazyClientGone(reply: FastifyReply): () => AbortSignal {
  let signal: AbortSignal | undefined;
  return () => (signal ??= clientGone(reply));
}

export interface RunRequest {
  agent: string;
  /** The body field the input came in, for errors about it. */
  inputField?: string;
  class: RunClass;
  /** Held for its caller (inline or streamed) and executed here; otherwise queued. */
  held: boolean;
  input: unknown;
  metadata?: unknown;
  schedule?: NewRun['schedule'];
  callbackUrl?: string;
  threadId?: string;
  config?: ClientConfig;
  apiRequest?: Record<string, unknown>;
}

/** The run to admit: its id chosen now (the thread is taken under it), its thread checked, its bounds set. */
export async function newRunOf(ctx: RouteContext, who: Principal, request: RunRequest): Promise<NewRun> {
  // System messages alone ask nothing: refused here, before the run would fail with nothing to answer.
  if (Array.isArray(request.input) && request.input.every((m: { role?: unknown }) => m.role === 'system')) {
    throw badRequest(`\`${request.inputField ?? 'input'}\` holds only system messages; add a user message`, {
      field: request.inputField ?? 'input',
    });
  }
  const thread =
    request.threadId === undefined ? undefined : await getThread(ctx.db, who.tenant, request.threadId);
  if (request.threadId !== undefined && !thread) throw notFound(`No thread \`${shown(request.threadId)}\``);
  return {
    id: newRunId(),
    agent: request.agent,
    class: request.class,
    mode: request.held ? 'inline' : 'queued',
    input: request.input,
    metadata: request.metadata,
    worker: ctx.executor.node,
    schedule: request.schedule,
    callbackUrl: request.callbackUrl,
    threadId: thread?.id,
    config: runConfig(request.config, ctx.settings, request.held),
    apiRequest: request.apiRequest,
  };
}

/** A refusal's 429, told to the metrics first. */
function refused(ctx: RouteContext, who: Principal, refusal: Refusal): HttpError {
  ctx.admissions?.refused(who.tenant, refusal);
  return refusalError(refusal);
}

/** Admits a queued (or scheduled) run, or throws its refusal. `withRun` writes more in its transaction. */
export async function admitQueued(
  ctx: RouteContext,
  who: Principal,
  newRun: NewRun,
  withRun?: WithRun,
): Promise<RunRow> {
  const admission = await admitRun(
    ctx.db,
    who,
    newRun,
    ctx.limitsFor(who.tenant),
    ctx.settings.statementTimeoutMs,
    ctx.clock,
    withRun,
  );
  if (!admission.ok) throw refused(ctx, who, admission.refusal);
  ctx.admissions?.admitted(newRun.class);
  if (newRun.schedule === undefined) ctx.executor.notify(newRun.class);
  return admission.run;
}

/**
 * Takes one of the user's places for a caller held on an open connection (runs.maxConcurrentPerUser),
 * or refuses with 429 scope `user`. Returns the release.
 */
export async function takePlace(ctx: RouteContext, who: Principal, runClass: RunClass): Promise<() => void> {
  const limit = ctx.settings.maxConcurrentPerUser;
  const place = await ctx.places.take(placeKeys.heldRuns(who.tenant, who.user), limit);
  if (!place.ok) {
    throw refused(ctx, who, {
      kind: 'concurrency',
      scope: 'user',
      class: runClass,
      limit: 'max_concurrent_per_user',
      limitValue: limit,
      active: place.held,
      retryAfterMs: userRetryAfterMs(ctx.db, who.tenant),
    });
  }
  return place.release;
}

export interface HeldRun {
  run: RunRow;
  /** Gives the user's place back; call once the run has ended. */
  release(): void;
}

/**
 * Admits a held run: the user's place first (cheap, in memory), then its thread (waiting while
 * busy, as `onBusy` says), then admission. Whatever refuses, what was taken before is given
 * back. The run is then `running` for this process, and the caller executes it.
 */
export async function admitHeld(
  ctx: RouteContext,
  who: Principal,
  newRun: NewRun,
  options: { onBusy?: OnBusy; signal: AbortSignal | (() => AbortSignal) },
): Promise<HeldRun> {
  const { db, settings } = ctx;
  const release = await takePlace(ctx, who, newRun.class);
  const id = newRun.id ?? newRunId();
  const threadId = newRun.threadId;
  let threadTaken = false;
  try {
    if (threadId !== undefined) {
      const lock = await holdThread(ctx, {
        thread: { id: threadId, tenant: who.tenant },
        runId: id,
        who,
        onBusy: options.onBusy ?? 'wait',
        waitMs: settings.threadBusyWaitMs,
        leaseMs: threadLeaseMs(settings),
        signal: typeof options.signal === 'function' ? options.signal() : options.signal,
      });
      if (!lock.ok) {
        if ('missing' in lock) throw notFound(`No thread \`${shown(threadId)}\``);
        if ('closed' in lock) throw draining();
        if ('requiresAction' in lock) throw threadRequiresAction(threadId, lock.requiresAction);
        if ('forbidden' in lock) {
          throw new HttpError(
            403,
            'permission_denied',
            `Thread ${threadId} is busy with run ${lock.forbidden} of another project; \`on_busy: "cancel"\` needs an admin token to cancel it`,
            { thread_id: threadId, active_run_id: lock.forbidden },
          );
        }
        throw new HttpError(
          409,
          'thread_busy',
          `Thread ${threadId} is busy with another run; it stayed busy for ${settings.threadBusyWaitMs} ms`,
          { thread_id: threadId, active_run_id: lock.activeRunId },
        );
      }
      threadTaken = true;
    }
    const admission = await admitRun(
      db,
      who,
      { ...newRun, id, mode: 'inline', threadLeaseMs: threadLeaseMs(settings) },
      ctx.limitsFor(who.tenant),
      settings.statementTimeoutMs,
      ctx.clock,
    );
    if (!admission.ok) throw refused(ctx, who, admission.refusal);
    ctx.admissions?.admitted(newRun.class);
    return { run: admission.run, release };
  } catch (error) {
    release();
    if (threadTaken) await unlockThread(db, threadId!, id).catch(() => undefined);
    throw error;
  }
}

/**
 * Holds a caller until a queued run ends, at most AGENT_SYNC_TIMEOUT_MS. Returns the run as it
 * stands then, and whether the process began draining meanwhile (the run goes on elsewhere).
 */
export async function waitForQueued(
  ctx: RouteContext,
  run: RunRow,
  signal: AbortSignal,
  windowMs = ctx.settings.syncTimeoutMs,
): Promise<{ run: RunRow; draining: boolean }> {
  const result = await ctx.waiters.wait(run.id, { timeoutMs: windowMs, signal });
  const current = (await getRun(ctx.db, run.tenant, run.id)) ?? run;
  return { run: current, draining: result === 'closed' };
}

/**
 * Holds a caller while a held run executes here, at most AGENT_SYNC_TIMEOUT_MS; then the run
 * goes on and the caller gets it as it stands.
 */
export async function waitForHeld(
  ctx: RouteContext,
  run: RunRow,
  finished: Promise<RunRow | undefined>,
  windowMs = ctx.settings.syncTimeoutMs,
): Promise<RunRow> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const window = new Promise<'window'>((resolve) => (timer = setTimeout(() => resolve('window'), windowMs)));
  const outcome = await Promise.race([finished, window]);
  clearTimeout(timer);
  if (outcome !== 'window' && outcome !== undefined) return outcome;
  return (await getRun(ctx.db, run.tenant, run.id)) ?? run;
}

/** How long the official OpenAI clients wait for an answer unless told otherwise (their default timeout). */
const OPENAI_CLIENT_TIMEOUT_MS = 600_000;

/**
 * How long to hold a caller that says how long it will wait: a little less than that, so it
 * gets its 202 before it gives up and retries (which would start the same work again), and
 * never more than the sync window. The official OpenAI clients send `X-Stainless-Timeout`
 * (seconds) when a request has its own timeout, and otherwise wait their default 10 minutes,
 * as long as the default sync window: without this they would always give up first.
 */
export function windowFor(
  headers: Record<string, string | string[] | undefined>,
  syncTimeoutMs: number,
): number {
  const raw = headers['x-stainless-timeout'];
  const seconds = typeof raw === 'string' ? Number(raw) : Number.NaN;
  const clientMs =
    Number.isFinite(seconds) && seconds > 0
      ? seconds * 1000
      : headers['x-stainless-lang'] !== undefined
        ? OPENAI_CLIENT_TIMEOUT_MS
        : undefined;
  if (clientMs === undefined) return syncTimeoutMs;
  return Math.max(100, Math.min(syncTimeoutMs, clientMs - Math.max(1_000, clientMs / 20)));
}
