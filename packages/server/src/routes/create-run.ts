import type { FastifyInstance } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { MAX_DELAY_SECONDS, agentParams, createRunBody } from '../http/schemas.js';
import { isSettled, type RunClass } from '../runs/lifecycle.js';
import { toApiRun, type NewRun, type RunRow } from '../runs/store.js';
import { clearPausedThread, type OnBusy } from '../threads/hold.js';
import type { RouteContext } from './context.js';
import { streamRun } from './stream-run.js';
import {
  admitHeld,
  admitQueued,
  lazyClientGone,
  newRunOf,
  takePlace,
  waitForHeld,
  waitForQueued,
  type ClientConfig,
} from './submit.js';

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
  config?: ClientConfig;
}

const YEAR_MS = MAX_DELAY_SECONDS * 1000;

/** When a run becomes due, from `run_at` or `delay_seconds`; undefined: now. */
function scheduleOf(body: CreateRunBody, now: number): NewRun['schedule'] {
  if (body.run_at !== undefined && body.delay_seconds !== undefined) {
    throw badRequest('Give `run_at` or `delay_seconds`, not both', { field: 'run_at' });
  }
  if (body.delay_seconds !== undefined) return { delayMs: body.delay_seconds * 1000 };
  if (body.run_at === undefined) return undefined;
  const atMs = typeof body.run_at === 'number' ? body.run_at * 1000 : Date.parse(body.run_at);
  if (atMs > now + YEAR_MS) {
    throw badRequest(`Expected \`run_at\` to be at most one year ahead, got \`${shown(body.run_at)}\``, {
      field: 'run_at',
      limit_value: MAX_DELAY_SECONDS,
    });
  }
  return { atMs };
}

export const interruptedError = (run: RunRow) =>
  new HttpError(503, 'agent_run_interrupted', `Run ${run.id} was interrupted by a server shutdown`, {
    run: toApiRun(run),
  });

export function createRunRoute(api: FastifyInstance, ctx: RouteContext): void {
  const { db, settings, executor } = ctx;

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
      const schedule = scheduleOf(body, ctx.clock.now());
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
      const newRun = await newRunOf(ctx, who, {
        agent: name,
        inputField: body.messages ? 'messages' : 'input',
        class: runClass,
        held,
        input,
        metadata: body.metadata,
        schedule,
        callbackUrl,
        threadId: body.thread_id,
        config: body.config,
      });
      const gone = lazyClientGone(reply);
      if (!held) {
        if (newRun.threadId !== undefined) {
          await clearPausedThread(ctx, {
            thread: { id: newRun.threadId, tenant: who.tenant },
            who,
            onBusy: body.on_busy ?? 'wait',
          });
        }
        if (schedule !== undefined || !wait) {
          return reply.status(202).send(toApiRun(await admitQueued(ctx, who, newRun)));
        }
        // A caller that waits on a queued run is held too: it takes one of the user's places.
        const release = await takePlace(ctx, who, runClass);
        const { run: current, draining } = await admitQueued(ctx, who, newRun)
          .then((run) => waitForQueued(ctx, run, gone()))
          .finally(release);
        if (draining)
          throw new HttpError(503, 'server_draining', 'This server is shutting down; the run goes on', {
            run: toApiRun(current),
          });
        if (current.error?.type === 'interrupted') throw interruptedError(current);
        return reply.status(isSettled(current.status) ? 200 : 202).send(toApiRun(current));
      }
      const { run, release } = await admitHeld(ctx, who, newRun, { onBusy: body.on_busy, signal: gone });
      // Once the run executes (execute registers it at once), a client that is already gone
      // cancels it now, and one that leaves later when it does.
      const cancelOnLeave = () => {
        if (body.on_disconnect !== 'cancel') return;
        const signal = gone();
        if (signal.aborted) executor.stop(run.id, 'cancel');
        else signal.addEventListener('abort', () => executor.stop(run.id, 'cancel'), { once: true });
      };
      if (body.stream) {
        const streaming = streamRun(reply, executor, run, { keepAliveMs: settings.streamKeepAliveMs, db });
        cancelOnLeave();
        void streaming.finally(release).catch(() => undefined);
        return reply;
      }
      const finished = executor.execute(run);
      cancelOnLeave();
      void finished.finally(release).catch(() => undefined);
      const final = await waitForHeld(ctx, run, finished);
      if (final.error?.type === 'interrupted') throw interruptedError(final);
      if (final.error?.type === 'timeout') {
        throw new HttpError(504, 'run_timeout', `Run ${run.id} passed its timeout and was stopped`, {
          run: toApiRun(final),
        });
      }
      return reply.status(isSettled(final.status) ? 200 : 202).send(toApiRun(final));
    },
  );
}
