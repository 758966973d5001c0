import type { FastifyInstance } from 'fastify';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { fillPage, pageLimit } from '../http/paging.js';
import { getRunQuery, listRunsQuery, runParams } from '../http/schemas.js';
import { CANCEL_CONFIRM_MS, cancelRun, mayCancel } from '../runs/cancel.js';
import { isFinal, isSettled, runStatuses, type RunClass } from '../runs/lifecycle.js';
import { decodeCursor, encodeCursor, getRun, listRuns, queueCounts, toApiRun } from '../runs/store.js';
import type { RouteContext } from './context.js';
import { createRunRoute } from './create-run.js';
import { resumeRoute } from './resume.js';
import { runEventsRoute } from './run-events.js';
import { clientGone } from '../http/client-gone.js';
import { withWaiting } from './run-waiting.js';

export function runRoutes(api: FastifyInstance, ctx: RouteContext): void {
  const { db, settings } = ctx;

  createRunRoute(api, ctx);
  resumeRoute(api, ctx);
  runEventsRoute(api, ctx);

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

  api.get<{ Params: { id: string }; Querystring: { wait_ms?: string } }>(
    '/agents/runs/:id',
    { schema: { summary: 'A run', params: runParams, querystring: getRunQuery } },
    async (request, reply) => {
      let run = await getRun(db, request.principal.tenant, request.params.id);
      // Another tenant's run does not exist, as far as this token can tell.
      if (!run) throw notFound(`No run \`${shown(request.params.id)}\``);
      // `wait_ms`: held until the run settles, at most that long and the sync window (@sluice/client's runs.wait).
      const waitMs = Math.min(Number(request.query.wait_ms ?? 0), settings.syncTimeoutMs);
      if (waitMs > 0 && !isSettled(run.status)) {
        await ctx.waiters.wait(run.id, { timeoutMs: waitMs, signal: clientGone(reply) });
        run = (await getRun(db, run.tenant, run.id)) ?? run;
      }
      return (await withWaiting(ctx, run.tenant, [run]))[0];
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
      if (!mayCancel(who, run)) {
        throw new HttpError(
          403,
          'permission_denied',
          `Run ${run.id} belongs to another project; an admin token can cancel it`,
        );
      }
      const current = await cancelRun(ctx, run, { confirmMs: CANCEL_CONFIRM_MS, signal: clientGone(reply) });
      return reply.status(isFinal(current.status) ? 200 : 202).send(toApiRun(current));
    },
  );

  api.get<{ Querystring: { limit?: string; cursor?: string; status?: string; class?: RunClass } }>(
    '/agents/runs',
    { schema: { summary: 'List runs, oldest first', querystring: listRunsQuery } },
    async (request) => {
      const q = request.query;
      const limit = pageLimit(q.limit);
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
      const { data: rendered, more } = fillPage(rows, limit, toApiRun);
      const page = rows.slice(0, rendered.length);
      const data = await withWaiting(ctx, request.principal.tenant, page);
      return {
        object: 'list',
        data,
        has_more: more,
        next_cursor: more ? encodeCursor(rows[page.length - 1]!) : null,
      };
    },
  );
}
