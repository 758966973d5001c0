import type { FastifyInstance } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { lazyClientGone } from '../http/client-gone.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { MAX_DELAY_SECONDS, agentParams, createRunBody } from '../http/schemas.js';
import type { RunClass } from '../runs/lifecycle.js';
import type { ClientConfig } from '../runs/run-config.js';
import { toApiRun, type NewRun, type RunRow } from '../runs/store.js';
import {
  submitAndWait,
  submitHeld,
  submitInline,
  submitQueued,
  type RunRequest,
  type Waited,
} from '../runs/submission.js';
import { imagePart, type StoredMessage } from '../media/parts.js';
import type { OnBusy } from '../threads/hold.js';
import type { RouteContext } from './context.js';
import { streamRun } from './stream-run.js';

type Block =
  | { type: 'text' | 'input_text'; text: string }
  | { type: 'input_image'; file_id?: string; image_url?: string; detail?: string };
type Message = { type?: 'message'; role: 'user' | 'assistant' | 'system'; content: string | Block[] };

/**
 * The runs API's input as a run stores it: messages as `{ role, content }`, `input_text` parts
 * as `text`, image parts checked and kept by reference or data: URL (media/parts.ts).
 */
function storedInput(input: string | Message[], field: string): string | StoredMessage[] {
  if (typeof input === 'string') return input;
  return input.map((m, i) => ({
    role: m.role,
    content:
      typeof m.content === 'string'
        ? m.content
        : m.content.map((part, j) =>
            part.type === 'input_image'
              ? imagePart(part, `${field}.${i}.content.${j}`)
              : { type: 'text' as const, text: part.text },
          ),
  }));
}

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

/** The process began draining while a caller waited: the run goes on elsewhere. */
export const drainingWithRun = (run: RunRow) =>
  new HttpError(503, 'server_draining', 'This server is shutting down; the run goes on', {
    run: toApiRun(run),
  });

/** The answer to a caller that waited: 200 once the run has settled, else 202 (it goes on). */
const statusOf = (waited: Waited) => (waited.kind === 'settled' ? 200 : 202);

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
      const given = body.messages ?? body.input;
      if (given === undefined)
        throw badRequest('Expected `input` (a string or messages) or `messages`', { field: 'input' });
      checkInput(given, body.messages ? 'messages' : 'input');
      const input = storedInput(given, body.messages ? 'messages' : 'input');
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
      const submission: RunRequest = {
        agent: name,
        inputField: body.messages ? 'messages' : 'input',
        class: runClass,
        input,
        metadata: body.metadata,
        schedule,
        callbackUrl,
        threadId: body.thread_id,
        config: body.config,
        onBusy: body.on_busy ?? 'wait',
      };
      const signal = lazyClientGone(reply);
      if (!held) {
        if (schedule !== undefined || !wait) {
          return reply.status(202).send(toApiRun(await submitQueued(ctx, who, submission)));
        }
        const waited = await submitAndWait(ctx, who, submission, { signal });
        if (waited.kind === 'draining') throw drainingWithRun(waited.run);
        if (waited.run.error?.type === 'interrupted') throw interruptedError(waited.run);
        return reply.status(statusOf(waited)).send(toApiRun(waited.run));
      }
      const onDisconnect = body.on_disconnect;
      if (body.stream) {
        const { done } = await submitHeld(ctx, who, submission, {
          signal,
          onDisconnect,
          play: (run) => streamRun(reply, executor, run, { keepAliveMs: settings.streamKeepAliveMs, db }),
        });
        void done.catch(() => undefined);
        return reply;
      }
      const waited = await submitInline(ctx, who, submission, { signal, onDisconnect });
      const final = waited.run;
      if (final.error?.type === 'interrupted') throw interruptedError(final);
      if (final.error?.type === 'timeout') {
        throw new HttpError(504, 'run_timeout', `Run ${final.id} passed its timeout and was stopped`, {
          run: toApiRun(final),
        });
      }
      return reply.status(statusOf(waited)).send(toApiRun(final));
    },
  );
}
