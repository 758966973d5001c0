import type { Database } from '@sluice/postgres/database';
import type { Clock } from 'sluice/concurrency';
import { placeKeys, type Places } from '../cache/places.js';
import { agentFor, type SluiceConfig } from '../config.js';
import { checkRunImages } from '../media/parts.js';
import type { AdmissionHooks } from '../ops/admissions.js';
import type { ServerSettings } from '../settings.js';
import type { Principal } from '../store/tokens.js';
import { clearPausedThread, holdThread, type HoldAttempt, type OnBusy } from '../threads/hold.js';
import { getThread, threadLeaseMs, unlockThread, type NewThread } from '../threads/store.js';
import { admitRun, mayStartEarly, userRetryAfterMs, type WithRun } from './admission.js';
import { provisionalRow, type EarlyStart } from './early-start.js';
import type { Executor } from './executor.js';
import { StopSignal } from './run-execution.js';
import type { RunClass } from './lifecycle.js';
import type { TenantLimits } from './policy.js';
import type { Refusal } from './refusal.js';
import { RunRefusedError, invalidInput, type RunRefusal } from './refused.js';
import { runConfig, type ClientConfig } from './run-config.js';
import { getRun, newRunId, type NewRun, type RunRow } from './store.js';
import { keptOnThread, undoingThread, type OpenedThread } from './opened-thread.js';
import type { RunWaiters } from './waiters.js';
import { waited, waitForRun, type Waited } from './wait-for-run.js';

export { waitForRun, type Waited } from './wait-for-run.js';

export { onOpenedThread, type OpenedThread } from './opened-thread.js';

/**
 * Creating a run, from start to end, for every front (the runs API, the OpenAI endpoints,
 * AG-UI, WebSocket, triggers). A front parses its request into a `RunRequest`, calls one of
 * these, and renders what comes back in its own shape:
 *
 * - `submitQueued`: a queued run (deferred, scheduled, background), answered at once;
 * - `submitAndWait`: a queued run whose caller waits for it, at most the sync window;
 * - `submitHeld`: a run held for its caller and executed here, by the front's `play` (which
 *   streams its events); `submitInline` is the same with the sync wait instead of a stream.
 *
 * Each owns its sequence: the run's bounds and thread, the user's place for a caller held on a
 * connection (given back when the run ends, or at once when a later check refuses), the
 * thread lock, admission, and cancel-on-disconnect from the client-gone signal it is given.
 * Refusals are thrown as `RunRefusedError` (runs/refused.ts); outcomes are returned.
 */

/** What submission needs of the app (the routes' context has all of it). */
export interface SubmissionDeps {
  readonly db: Database;
  /** The agents, for what a run's input may hold (images, for a model that reads them). */
  readonly config: SluiceConfig;
  readonly settings: ServerSettings;
  readonly executor: Executor;
  readonly waiters: RunWaiters;
  /** Held runs per user (the cache store's places). */
  readonly places: Places;
  readonly limitsFor: (tenant: string) => TenantLimits;
  /** What admission reads the time from (its Retry-After estimate). */
  readonly clock: Clock;
  /** Hears each admission decision (the metrics and the dashboard's refusals). */
  readonly admissions?: AdmissionHooks;
}

export interface RunRequest {
  agent: string;
  /** The body field the input came in, for refusals about it. */
  inputField?: string;
  class: RunClass;
  input: unknown;
  metadata?: unknown;
  schedule?: NewRun['schedule'];
  callbackUrl?: string;
  threadId?: string;
  config?: ClientConfig;
  apiRequest?: Record<string, unknown>;
  /**
   * A held run waits while its thread is busy, or with `'cancel'` stops the run that holds it.
   * A queued run given `onBusy` is checked against a thread paused for a person at once
   * (refused, or with `'cancel'` the paused run is cancelled); without it, it queues behind.
   */
  onBusy?: OnBusy;
  /**
   * The thread was created by the front for this request (`threadId` names it): a refusal
   * removes it again, so a refused request leaves no row it created (see `dropNewThread`).
   */
  newThread?: NewThread;
  /**
   * The thread (`threadId`) was found made by another request that may remove it when refused
   * (see `onOpenedThread`): a queued run admitted on it looks that it is still there, and is
   * moved to the thread this opens again when it is not.
   */
  reopenThread?: () => Promise<OpenedThread | undefined>;
}

/** The client-gone signal, or its maker: made only when first needed (most refusals never need it). */
export type ClientGone = AbortSignal | (() => AbortSignal);

export interface HeldRun {
  run: RunRow;
  /** Settles once `play` has and the user's place is given back; rejects as `play` does. */
  done: Promise<void>;
}

/** Queues a run (or schedules it) and wakes a worker of its class; `withRun` writes more in its transaction. */
export async function submitQueued(
  deps: SubmissionDeps,
  who: Principal,
  request: RunRequest,
  options: { withRun?: WithRun } = {},
): Promise<RunRow> {
  return undoingThread(deps, request, async () =>
    keptOnThread(
      deps,
      request,
      await admitQueued(deps, who, await queuedRunOf(deps, who, request), options.withRun),
    ),
  );
}

/**
 * Queues a run and holds its caller until it settles, at most the sync window (`windowMs`,
 * by default AGENT_SYNC_TIMEOUT_MS). A waiting caller is held too: it takes one of the user's
 * places for as long as it waits.
 */
export async function submitAndWait(
  deps: SubmissionDeps,
  who: Principal,
  request: RunRequest,
  options: { signal: ClientGone; windowMs?: number },
): Promise<Waited> {
  const { run, release } = await undoingThread(deps, request, async () => {
    const newRun = await queuedRunOf(deps, who, request);
    const place = await takePlace(deps, who, newRun.class);
    try {
      return { run: await keptOnThread(deps, request, await admitQueued(deps, who, newRun)), release: place };
    } catch (error) {
      place();
      throw error;
    }
  });
  try {
    return await waitForRun(deps, run, signalOf(options.signal), options.windowMs);
  } finally {
    release();
  }
}

/**
 * Admits a run held for its caller (the user's place, the thread, admission) and hands it to
 * `play`, which executes it here. The place is given back once `play` has settled. With
 * `onDisconnect: 'cancel'` the run stops when the client goes (at once if it has gone already);
 * otherwise it goes on without it.
 */
export async function submitHeld(
  deps: SubmissionDeps,
  who: Principal,
  request: RunRequest,
  options: {
    signal: ClientGone;
    onDisconnect?: 'continue' | 'cancel';
    play: (run: RunRow) => Promise<unknown>;
  },
): Promise<HeldRun> {
  const { run, release } = await undoingThread(deps, request, async () =>
    admitHeld(deps, who, await newRunOf(deps, who, request, true), request.onBusy ?? 'wait', options.signal, {
      cancelOnLeave: options.onDisconnect === 'cancel',
    }),
  );
  let playing: Promise<unknown>;
  try {
    // Called at once: the executor registers the run before a disconnect can be heard.
    playing = options.play(run);
  } catch (error) {
    deps.executor.abandon(run);
    release();
    throw error;
  }
  // A run started early waits for its front to execute it; a front that ended without (it
  // failed first) would leave it waiting.
  playing = playing.finally(() => deps.executor.abandon(run));
  const stopListening =
    options.onDisconnect === 'cancel' ? cancelOnLeave(deps.executor, run.id, signalOf(options.signal)) : noop;
  const ended = () => {
    stopListening();
    release();
  };
  return { run, done: playing.then(() => undefined).finally(ended) };
}

/** A held run executed here while its caller waits, at most the sync window; then it goes on. */
export async function submitInline(
  deps: SubmissionDeps,
  who: Principal,
  request: RunRequest,
  options: { signal: ClientGone; onDisconnect?: 'continue' | 'cancel'; windowMs?: number },
): Promise<Waited> {
  let finished: Promise<RunRow | undefined> | undefined;
  const { run, done } = await submitHeld(deps, who, request, {
    ...options,
    play: (admitted) => (finished = deps.executor.execute(admitted)),
  });
  void done.catch(() => undefined);
  const windowMs = options.windowMs ?? deps.settings.syncTimeoutMs;
  return waited(await waitForHeld(deps.db, run, finished!, windowMs));
}

const signalOf = (gone: ClientGone): AbortSignal => (typeof gone === 'function' ? gone() : gone);

const noop = () => undefined;

/**
 * Stops the run when the client goes (at once if it has gone). Returns the listener's removal,
 * for when the run has ended: one signal may outlive many runs (a WebSocket's), and a listener
 * left per ended run would pile up for as long as the socket lives.
 */
function cancelOnLeave(executor: Executor, runId: string, signal: AbortSignal): () => void {
  if (signal.aborted) {
    executor.stop(runId, 'cancel');
    return noop;
  }
  const stop = () => executor.stop(runId, 'cancel');
  signal.addEventListener('abort', stop, { once: true });
  return () => signal.removeEventListener('abort', stop);
}

/** The run to admit: its id chosen now (the thread is taken under it), its thread checked, its bounds set. */
async function newRunOf(
  deps: SubmissionDeps,
  who: Principal,
  request: RunRequest,
  held: boolean,
): Promise<NewRun> {
  // System messages alone ask nothing: refused here, before the run would fail with nothing to answer.
  const field = request.inputField ?? 'input';
  if (Array.isArray(request.input) && request.input.every((m: { role?: unknown }) => m.role === 'system')) {
    throw invalidInput(`\`${field}\` holds only system messages; add a user message`, field);
  }
  const thread =
    request.threadId === undefined ? undefined : await getThread(deps.db, who.tenant, request.threadId);
  if (request.threadId !== undefined && !thread) {
    throw new RunRefusedError({ kind: 'thread_missing', threadId: request.threadId });
  }
  await checkRunImages(
    deps.db,
    who.tenant,
    request.input,
    field,
    takesImages(deps.config, who, request.agent),
  );
  return {
    id: newRunId(),
    agent: request.agent,
    class: request.class,
    mode: held ? 'inline' : 'queued',
    input: request.input,
    metadata: request.metadata,
    worker: deps.executor.node,
    schedule: request.schedule,
    callbackUrl: request.callbackUrl,
    threadId: thread?.id,
    config: runConfig(request.config, deps.settings, held),
    apiRequest: request.apiRequest,
  };
}

/** Whether the agent's model reads images: a sluice agent says so (`modelInput`); any other object is taken to. */
function takesImages(config: SluiceConfig, who: Principal, name: string): boolean {
  const agent = agentFor(config, who.tenant, name) as { modelInput?: readonly string[] } | undefined;
  return agent?.modelInput?.includes('image') ?? true;
}

async function queuedRunOf(deps: SubmissionDeps, who: Principal, request: RunRequest): Promise<NewRun> {
  const newRun = await newRunOf(deps, who, request, false);
  if (request.onBusy !== undefined && newRun.threadId !== undefined) {
    await clearPausedThread(deps, {
      thread: { id: newRun.threadId, tenant: who.tenant },
      who,
      onBusy: request.onBusy,
    });
  }
  return newRun;
}

/** An admission refusal, told to the metrics first. */
function refused(deps: SubmissionDeps, who: Principal, refusal: Refusal): RunRefusedError {
  deps.admissions?.refused(who.tenant, refusal);
  return new RunRefusedError(refusal);
}

async function admitQueued(
  deps: SubmissionDeps,
  who: Principal,
  newRun: NewRun,
  withRun?: WithRun,
): Promise<RunRow> {
  const { db, settings } = deps;
  const limits = deps.limitsFor(who.tenant);
  const admission = await admitRun(db, who, newRun, limits, settings.statementTimeoutMs, deps.clock, withRun);
  if (!admission.ok) throw refused(deps, who, admission.refusal);
  deps.admissions?.admitted(newRun.class);
  deps.executor.streams.created(admission.run);
  if (newRun.schedule === undefined) deps.executor.notify(newRun.class);
  else deps.executor.scheduled();
  return admission.run;
}

/**
 * Takes one of the user's places for a caller held on an open connection
 * (runs.maxConcurrentPerUser), or refuses with scope `user`. Returns the release.
 */
async function takePlace(deps: SubmissionDeps, who: Principal, runClass: RunClass): Promise<() => void> {
  const limit = deps.settings.maxConcurrentPerUser;
  const place = await deps.places.take(placeKeys.heldRuns(who.tenant, who.user), limit);
  if (!place.ok) {
    throw refused(deps, who, {
      kind: 'concurrency',
      scope: 'user',
      class: runClass,
      limit: 'max_concurrent_per_user',
      limitValue: limit,
      active: place.held,
      retryAfterMs: userRetryAfterMs(deps.db, who.tenant),
    });
  }
  return place.release;
}

/** Why a thread could not be taken, as a refusal. */
function threadRefusal(
  lock: Exclude<HoldAttempt, { ok: true }>,
  threadId: string,
  waitedMs: number,
): RunRefusal {
  if ('missing' in lock) return { kind: 'thread_missing', threadId };
  if ('closed' in lock) return { kind: 'draining' };
  if ('requiresAction' in lock)
    return { kind: 'thread_requires_action', threadId, runId: lock.requiresAction };
  if ('forbidden' in lock) {
    return { kind: 'thread_forbidden', threadId, activeRunId: lock.forbidden, paused: false };
  }
  return { kind: 'thread_busy', threadId, activeRunId: lock.activeRunId, waitedMs };
}

/**
 * Admits a held run: the user's place first (cheap, in memory), then its thread (waiting while
 * busy, as `onBusy` says), then admission. Whatever refuses, what was taken before is given
 * back. The run is then `running` for this process, and the caller executes it.
 */
async function admitHeld(
  deps: SubmissionDeps,
  who: Principal,
  newRun: NewRun,
  onBusy: OnBusy,
  gone: ClientGone,
  options: { cancelOnLeave: boolean },
): Promise<{ run: RunRow; release: () => void }> {
  const { db, settings } = deps;
  const release = await takePlace(deps, who, newRun.class);
  const id = newRun.id ?? newRunId();
  const threadId = newRun.threadId;
  let threadTaken = false;
  let early: EarlyStart | undefined;
  try {
    if (threadId !== undefined) {
      const lock = await holdThread(deps, {
        thread: { id: threadId, tenant: who.tenant },
        runId: id,
        who,
        onBusy,
        waitMs: settings.threadBusyWaitMs,
        leaseMs: threadLeaseMs(settings),
        signal: signalOf(gone),
      });
      if (!lock.ok) throw new RunRefusedError(threadRefusal(lock, threadId, settings.threadBusyWaitMs));
      threadTaken = true;
    }
    const toAdmit = { ...newRun, id, mode: 'inline' as const, threadLeaseMs: threadLeaseMs(settings) };
    const limits = deps.limitsFor(who.tenant);
    // Expected to be admitted in one statement: its agent starts beside the statement (asked
    // for first, so it goes out first).
    const provisional =
      threadId === undefined && mayStartEarly(db, who, toAdmit, limits, deps.clock)
        ? provisionalRow(who, toAdmit, deps.clock.now())
        : undefined;
    const admitting = admitRun(db, who, toAdmit, limits, settings.statementTimeoutMs, deps.clock);
    if (provisional) early = deps.executor.startEarly(provisional);
    // A caller that leaves while admission answers stops the run it started early, as it would
    // stop it once admitted.
    const stopListening = early && options.cancelOnLeave ? stopEarlyOnLeave(early, signalOf(gone)) : noop;
    const admission = await admitting.finally(stopListening);
    if (!admission.ok) throw refused(deps, who, admission.refusal);
    deps.admissions?.admitted(newRun.class);
    deps.executor.streams.created(admission.run);
    return { run: admission.run, release };
  } catch (error) {
    early?.refuse(new StopSignal('refused'));
    release();
    if (threadTaken) await unlockThread(db, threadId!, id).catch(() => undefined);
    throw error;
  }
}

/** Cancels a run started early when its caller leaves; returns the listener's removal. */
function stopEarlyOnLeave(early: EarlyStart, signal: AbortSignal): () => void {
  const stop = () => early.controller.abort(new StopSignal('cancel'));
  if (signal.aborted) {
    stop();
    return noop;
  }
  signal.addEventListener('abort', stop, { once: true });
  return () => signal.removeEventListener('abort', stop);
}

/** Races a held run against the sync window; past it, the run as it stands. */
async function waitForHeld(
  db: Database,
  run: RunRow,
  finished: Promise<RunRow | undefined>,
  windowMs: number,
): Promise<RunRow> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const window = new Promise<'window'>((resolve) => (timer = setTimeout(() => resolve('window'), windowMs)));
  const outcome = await Promise.race([finished, window]);
  clearTimeout(timer);
  if (outcome !== 'window' && outcome !== undefined) return outcome;
  return (await getRun(db, run.tenant, run.id)) ?? run;
}
