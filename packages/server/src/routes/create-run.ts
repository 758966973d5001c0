import type { FastifyInstance, FastifyReply } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, refusalError, shown } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { MAX_DELAY_SECONDS, agentParams, createRunBody } from '../http/schemas.js';
import { admitRun } from '../runs/admission.js';
import { isFinal, type RunClass } from '../runs/lifecycle.js';
import { getRun, newRunId, toApiRun, type NewRun, type RunConfig, type RunRow } from '../runs/store.js';
import type { ServerSettings } from '../settings.js';
import { holdThread, type OnBusy } from '../threads/hold.js';
import { getThread, threadLeaseMs, unlockThread } from '../threads/store.js';
import type { Principal } from '../store/tokens.js';
import type { RouteContext } from './context.js';
import { streamRun } from './stream-run.js';

type Message = { role: 'user' | 'assistant' | 'system'; content: string | { type: 'text'; text: string }[] };

interface CreateRunBody {
  input?: string | Message[];
  messages?: Message[];
  class?: RunClass;
  wait?: boolean;
  run_at?: string | number;
  delay_seconds?: number;
  metadata?: Record<string, unknown>;
  callback_url?: string;
  thread_id?: string;
  on_busy?: OnBusy;
  stream?: boolean;
  on_disconnect?: 'continue' | 'cancel';
  config?: {
    timeout_ms?: number | null;
    tool_timeout_ms?: number | null;
    turn_timeout_ms?: number | null;
    max_parallel_tool_calls?: number;
  };
}

const YEAR_MS = MAX_DELAY_SECONDS * 1000;

/** When a run becomes due, from `run_at` or `delay_seconds`; undefined: now. */
function scheduleOf(body: CreateRunBody): NewRun['schedule'] {
  if (body.run_at !== undefined && body.delay_seconds !== undefined) {
    throw badRequest('Give `run_at` or `delay_seconds`, not both', { field: 'run_at' });
  }
  if (body.delay_seconds !== undefined) return { delayMs: body.delay_seconds * 1000 };
  if (body.run_at === undefined) return undefined;
  const atMs = typeof body.run_at === 'number' ? body.run_at * 1000 : Date.parse(body.run_at);
  if (atMs > Date.now() + YEAR_MS) {
    throw badRequest(`Expected \`run_at\` to be at most one year ahead, got \`${shown(body.run_at)}\``, {
      field: 'run_at',
      limit_value: MAX_DELAY_SECONDS,
    });
  }
  return { atMs };
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
function runConfig(given: CreateRunBody['config'], settings: ServerSettings, held: boolean): RunConfig {
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

/** A signal that aborts when the client goes away before it was answered. */
export function clientGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) controller.abort();
  });
  return controller.signal;
}

export const interruptedError = (run: RunRow) =>
  new HttpError(503, 'agent_run_interrupted', `Run ${run.id} was interrupted by a server shutdown`, {
    run: toApiRun(run),
  });

export function createRunRoute(api: FastifyInstance, ctx: RouteContext): void {
  const { db, settings, executor, waiters } = ctx;

  api.post<{ Params: { agent: string }; Body: CreateRunBody }>(
    '/agents/:agent/runs',
    { schema: { summary: 'Create a run', params: agentParams, body: createRunBody } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'create runs');
      const name = request.params.agent;
      if (!agentFor(ctx.config, who.tenant, name)) throw notFound(`No agent \`${shown(name)}\``);
      const body = request.body ?? {};
      if (body.input !== undefined && body.messages !== undefined)
        throw badRequest('Give `input` or `messages`, not both', { field: 'messages' });
      const input = body.messages ?? body.input;
      if (input === undefined)
        throw badRequest('Expected `input` (a string or messages) or `messages`', { field: 'input' });
      checkInput(input, body.messages ? 'messages' : 'input');
      let callbackUrl: string | undefined;
      if (body.callback_url !== undefined) {
        const checked = await ctx.checkCallbackUrl(body.callback_url);
        if (!checked.ok) throw badRequest(checked.message, { field: 'callback_url' });
        callbackUrl = checked.url;
      }
      const schedule = scheduleOf(body);
      const runClass = body.class ?? 'default';
      if (body.stream && (runClass !== 'default' || schedule !== undefined || body.wait === false)) {
        throw badRequest(
          'A streamed run is held for its caller: it cannot be deferred, scheduled or sent with `wait: false`',
          { field: 'stream' },
        );
      }
      // Deferred work is answered at once unless the caller asks to wait: waiting on a queue is
      // what deferred runs are for avoiding.
      const wait = body.wait ?? runClass === 'default';
      const held = body.stream === true || (wait && runClass === 'default' && schedule === undefined);
      const thread =
        body.thread_id === undefined ? undefined : await getThread(db, who.tenant, body.thread_id);
      if (body.thread_id !== undefined && !thread) throw notFound(`No thread \`${shown(body.thread_id)}\``);
      const newRun: NewRun = {
        id: newRunId(),
        agent: name,
        class: runClass,
        mode: held ? 'inline' : 'queued',
        input,
        metadata: body.metadata,
        worker: executor.node,
        schedule,
        callbackUrl,
        threadId: thread?.id,
        config: runConfig(body.config, settings, held),
      };
      if (!held) return queued(who, newRun, wait, reply);

      // A held run: the user's place first (cheap, in memory), then the thread, then admission.
      const place = ctx.heldRuns.take(who.tenant, who.user, settings.maxConcurrentPerUser);
      if (!place.ok) {
        throw refusalError({
          kind: 'concurrency',
          scope: 'user',
          class: runClass,
          limit: 'max_concurrent_per_user',
          limitValue: settings.maxConcurrentPerUser,
          active: place.held,
        });
      }
      let run: RunRow;
      const gone = clientGone(reply);
      try {
        if (thread) {
          const lock = await holdThread(ctx, {
            thread,
            runId: newRun.id!,
            onBusy: body.on_busy ?? 'wait',
            waitMs: settings.threadBusyWaitMs,
            leaseMs: threadLeaseMs(settings),
            signal: gone,
          });
          if (!lock.ok) {
            if ('missing' in lock) throw notFound(`No thread \`${shown(thread.id)}\``);
            throw new HttpError(
              409,
              'thread_busy',
              `Thread ${thread.id} is busy with another run; it stayed busy for ${settings.threadBusyWaitMs} ms`,
              { thread_id: thread.id, active_run_id: lock.activeRunId },
            );
          }
        }
        const admission = await admitRun(
          db,
          who,
          newRun,
          ctx.limitsFor(who.tenant),
          settings.statementTimeoutMs,
        ).catch(async (error: unknown) => {
          if (thread) await unlockThread(db, thread.id, newRun.id!).catch(() => undefined);
          throw error;
        });
        if (!admission.ok) {
          if (thread) await unlockThread(db, thread.id, newRun.id!).catch(() => undefined);
          throw refusalError(admission.refusal);
        }
        run = admission.run;
      } catch (error) {
        place.release();
        throw error;
      }
      if (body.on_disconnect === 'cancel')
        gone.addEventListener('abort', () => executor.stop(run.id, 'cancel'));
      if (body.stream) {
        const finished = streamRun(reply, executor, run, { keepAliveMs: settings.streamKeepAliveMs, db });
        void finished.finally(place.release);
        return reply;
      }
      const finished = executor.execute(run);
      void finished.finally(place.release);
      return inline(who, run, finished, reply);
    },
  );

  /** A run for the queues: answered at once, or held while it waits when the caller asks. */
  async function queued(who: Principal, newRun: NewRun, wait: boolean, reply: FastifyReply) {
    const admission = await admitRun(db, who, newRun, ctx.limitsFor(who.tenant), settings.statementTimeoutMs);
    if (!admission.ok) throw refusalError(admission.refusal);
    const run = admission.run;
    if (newRun.schedule !== undefined) return reply.status(202).send(toApiRun(run));
    executor.notify();
    if (!wait) return reply.status(202).send(toApiRun(run));
    const result = await waiters.wait(run.id, {
      timeoutMs: settings.syncTimeoutMs,
      signal: clientGone(reply),
    });
    const current = (await getRun(db, who.tenant, run.id)) ?? run;
    if (result === 'closed')
      throw new HttpError(503, 'server_draining', 'This server is shutting down; the run goes on', {
        run: toApiRun(current),
      });
    if (current.error?.type === 'interrupted') throw interruptedError(current);
    return reply.status(isFinal(current.status) ? 200 : 202).send(toApiRun(current));
  }

  /** An inline run, executed here: the caller is held up to the sync window, then answered 202 while it goes on. */
  async function inline(
    who: Principal,
    run: RunRow,
    finished: Promise<RunRow | undefined>,
    reply: FastifyReply,
  ) {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const window = new Promise<'window'>(
      (resolve) => (timer = setTimeout(() => resolve('window'), settings.syncTimeoutMs)),
    );
    const outcome = await Promise.race([finished, window]);
    clearTimeout(timer);
    const final =
      outcome === 'window' || outcome === undefined ? await getRun(db, who.tenant, run.id) : outcome;
    if (!final) return reply.status(202).send(toApiRun(run));
    if (final.error?.type === 'interrupted') throw interruptedError(final);
    if (final.error?.type === 'timeout') {
      throw new HttpError(504, 'run_timeout', `Run ${run.id} passed its timeout and was stopped`, {
        run: toApiRun(final),
      });
    }
    return reply.status(isFinal(final.status) ? 200 : 202).send(toApiRun(final));
  }
}
