import type { FastifyInstance, FastifyReply } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, refusalError, shown } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { MAX_DELAY_SECONDS, agentParams, createRunBody, listRunsQuery, runParams } from '../http/schemas.js';
import { admitRun } from '../runs/admission.js';
import { isFinal, runStatuses, type RunClass } from '../runs/lifecycle.js';
import {
  cancelNotStarted,
  decodeCursor,
  encodeCursor,
  getRun,
  listRuns,
  queueCounts,
  requestCancel,
  toApiRun,
  type NewRun,
  type RunRow,
} from '../runs/store.js';
import type { RouteContext } from './context.js';

interface CreateRunBody {
  input:
    string | { role: 'user' | 'assistant' | 'system'; content: string | { type: 'text'; text: string }[] }[];
  class?: RunClass;
  wait?: boolean;
  run_at?: string | number;
  delay_seconds?: number;
  metadata?: Record<string, unknown>;
  callback_url?: string;
}

const DEFAULT_PAGE = 100;
const MAX_PAGE = 1000;
/** A page stops growing past this many bytes of JSON (list rows carry no input or output, so it rarely matters). */
export const MAX_PAGE_BYTES = 4 * 1024 * 1024;
/** How long a cancel of a run on another process waits for that process to confirm. */
const CANCEL_CONFIRM_MS = 5_000;
const YEAR_MS = MAX_DELAY_SECONDS * 1000;

/** When a run becomes due, from `run_at` or `delay_seconds`; undefined: now. */
function scheduleOf(body: CreateRunBody): NewRun['schedule'] {
  if (body.run_at !== undefined && body.delay_seconds !== undefined) {
    throw badRequest('Give `run_at` or `delay_seconds`, not both', { field: 'run_at' });
  }
  if (body.delay_seconds !== undefined) return { delayMs: body.delay_seconds * 1000 };
  if (body.run_at === undefined) return undefined;
  const atMs = typeof body.run_at === 'number' ? body.run_at * 1000 : Date.parse(body.run_at);
  if (!Number.isFinite(atMs))
    throw badRequest(`\`run_at\` is not a real time: \`${shown(body.run_at)}\``, { field: 'run_at' });
  if (atMs > Date.now() + YEAR_MS) {
    throw badRequest(`Expected \`run_at\` to be at most one year ahead, got \`${shown(body.run_at)}\``, {
      field: 'run_at',
      limit_value: MAX_DELAY_SECONDS,
    });
  }
  return { atMs };
}

/** A signal that aborts when the client goes away before it was answered. */
function clientGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) controller.abort();
  });
  return controller.signal;
}

export function runRoutes(api: FastifyInstance, ctx: RouteContext): void {
  const { db, settings, executor, waiters } = ctx;

  const interrupted = (run: RunRow) =>
    new HttpError(503, 'agent_run_interrupted', `Run ${run.id} was interrupted by a server shutdown`, {
      run: toApiRun(run),
    });

  api.post<{ Params: { agent: string }; Body: CreateRunBody }>(
    '/agents/:agent/runs',
    { schema: { summary: 'Create a run', params: agentParams, body: createRunBody } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'create runs');
      const name = request.params.agent;
      if (!agentFor(ctx.config, who.tenant, name)) throw notFound(`No agent \`${shown(name)}\``);
      const body = request.body;
      checkInput(body.input);
      let callbackUrl: string | undefined;
      if (body.callback_url !== undefined) {
        const checked = await ctx.checkCallbackUrl(body.callback_url);
        if (!checked.ok) throw badRequest(checked.message, { field: 'callback_url' });
        callbackUrl = checked.url;
      }
      const schedule = scheduleOf(body);
      const runClass = body.class ?? 'default';
      // Deferred work is answered at once unless the caller asks to wait: waiting on a queue is
      // what deferred runs are for avoiding.
      const wait = body.wait ?? runClass === 'default';
      const inline = wait && runClass === 'default' && schedule === undefined;
      const admission = await admitRun(
        db,
        who,
        {
          agent: name,
          class: runClass,
          mode: inline ? 'inline' : 'queued',
          input: body.input,
          metadata: body.metadata,
          worker: executor.node,
          schedule,
          callbackUrl,
        },
        ctx.limitsFor(who.tenant),
        settings.statementTimeoutMs,
      );
      if (!admission.ok) throw refusalError(admission.refusal);
      const run = admission.run;
      if (schedule !== undefined) return reply.status(202).send(toApiRun(run));
      if (!inline) {
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
        if (current.error?.type === 'interrupted') throw interrupted(current);
        return reply.status(isFinal(current.status) ? 200 : 202).send(toApiRun(current));
      }
      // Inline: executed here; the connection is held up to the sync window, then answered 202
      // while the run goes on.
      const finished = executor.execute(run);
      let timer: ReturnType<typeof setTimeout> | undefined;
      const window = new Promise<'window'>(
        (resolve) => (timer = setTimeout(() => resolve('window'), settings.syncTimeoutMs)),
      );
      const outcome = await Promise.race([finished, window]);
      clearTimeout(timer);
      const final =
        outcome === 'window' || outcome === undefined ? await getRun(db, who.tenant, run.id) : outcome;
      if (!final) return reply.status(202).send(toApiRun(run));
      if (final.error?.type === 'interrupted') throw interrupted(final);
      return reply.status(isFinal(final.status) ? 200 : 202).send(toApiRun(final));
    },
  );

  api.get('/agents/runs/queue', { schema: { summary: "The tenant's queues" } }, async (request) => {
    const who = request.principal;
    const limits = ctx.limitsFor(who.tenant);
    const { count, oldestDeferred } = await queueCounts(db, who.tenant, who.project);
    const figures = (cls: string, mine = false) => ({
      running: count(cls, 'running', mine),
      queued: count(cls, 'queued', mine),
      scheduled: count(cls, 'scheduled', mine),
    });
    return {
      object: 'agent.run_queue',
      default: { ...figures('default'), limit: limits.activePerTenant },
      deferred: {
        ...figures('deferred'),
        running_limit: settings.deferredMaxRunningPerTenant,
        queued_limit: limits.deferredQueued,
        oldest_queued_at: oldestDeferred === null ? null : Math.floor(oldestDeferred),
      },
      project: { default: figures('default', true), deferred: figures('deferred', true) },
    };
  });

  api.get<{ Params: { id: string } }>(
    '/agents/runs/:id',
    { schema: { summary: 'A run', params: runParams } },
    async (request) => {
      const run = await getRun(db, request.principal.tenant, request.params.id);
      // Another tenant's run does not exist, as far as this token can tell.
      if (!run) throw notFound(`No run \`${shown(request.params.id)}\``);
      return toApiRun(run);
    },
  );

  api.post<{ Params: { id: string } }>(
    '/agents/runs/:id/cancel',
    { schema: { summary: 'Cancel a run', params: runParams } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'cancel runs');
      const run = await getRun(db, who.tenant, request.params.id);
      if (!run) throw notFound(`No run \`${shown(request.params.id)}\``);
      // A member cancels its own project's runs; an admin any run of the tenant.
      if (who.role !== 'admin' && run.project !== who.project) {
        throw new HttpError(
          403,
          'permission_denied',
          `Run ${run.id} belongs to another project; an admin token can cancel it`,
        );
      }
      if (isFinal(run.status)) return toApiRun(run);
      const stopped = await cancelNotStarted(db, who.tenant, run.id);
      if (stopped) return toApiRun(stopped);
      if (executor.stop(run.id, 'cancel')) {
        return toApiRun((await executor.settled(run.id)) ?? (await getRun(db, who.tenant, run.id)) ?? run);
      }
      // Running on another process: ask it, and wait a little for it to confirm. Until it does,
      // the run still counts for every cap.
      if ((await requestCancel(db, who.tenant, run.id)) !== undefined) {
        await waiters.wait(run.id, { timeoutMs: CANCEL_CONFIRM_MS, signal: clientGone(reply) });
      }
      const current = (await getRun(db, who.tenant, run.id)) ?? run;
      return reply.status(isFinal(current.status) ? 200 : 202).send(toApiRun(current));
    },
  );

  api.get<{ Querystring: { limit?: string; cursor?: string; status?: string; class?: RunClass } }>(
    '/agents/runs',
    { schema: { summary: 'List runs, oldest first', querystring: listRunsQuery } },
    async (request) => {
      const q = request.query;
      let limit = DEFAULT_PAGE;
      if (q.limit !== undefined) {
        const n = Number(q.limit);
        if (n < 1)
          throw badRequest(
            `Expected \`limit\` to be a whole number from 1 to ${MAX_PAGE}, got \`${q.limit}\``,
            { field: 'limit' },
          );
        limit = Math.min(MAX_PAGE, n);
      }
      const after = q.cursor === undefined ? undefined : decodeCursor(q.cursor);
      if (q.cursor !== undefined && !after)
        throw badRequest(`Malformed \`cursor\` \`${shown(q.cursor)}\``, { field: 'cursor' });
      const wanted = q.status === undefined ? undefined : q.status.split(',');
      for (const s of wanted ?? []) {
        if (!(runStatuses as readonly string[]).includes(s)) {
          throw badRequest(`Unknown status \`${shown(s)}\`; expected some of ${runStatuses.join(', ')}`, {
            field: 'status',
          });
        }
      }
      const rows = await listRuns(db, request.principal.tenant, {
        statuses: wanted,
        class: q.class,
        limit: limit + 1,
        after,
      });
      const data: ReturnType<typeof toApiRun>[] = [];
      let bytes = 0;
      for (const row of rows.slice(0, limit)) {
        const item = toApiRun(row);
        bytes += Buffer.byteLength(JSON.stringify(item));
        if (bytes > MAX_PAGE_BYTES && data.length > 0) break;
        data.push(item);
      }
      const more = rows.length > data.length;
      return {
        object: 'list',
        data,
        has_more: more,
        next_cursor: more ? encodeCursor(rows[data.length - 1]!) : null,
      };
    },
  );
}
