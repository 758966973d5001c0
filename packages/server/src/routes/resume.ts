import type { FastifyInstance } from 'fastify';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { runParams } from '../http/schemas.js';
import { checkApprovals } from '../runs/approvals.js';
import { mayCancel } from '../runs/cancel.js';
import { resumeRun } from '../runs/lifecycle.js';
import { getRun, toApiRun, type RunRow } from '../runs/store.js';
import { waitForRun } from '../runs/submission.js';
import { clientGone } from '../http/client-gone.js';
import type { RouteContext } from './context.js';
import { drainingWithRun } from './create-run.js';

interface ResumeBody {
  approvals?: unknown;
  wait?: unknown;
}

const notPaused = (run: RunRow) =>
  new HttpError(
    409,
    'run_not_requires_action',
    `Run ${run.id} is ${run.status}: only a run in requires_action can be resumed`,
    { run_id: run.id, status: run.status },
  );

/**
 * `POST /agents/runs/:id/resume`: answers the pending calls of a paused run and puts it back in
 * the queue, where it keeps its place. No cap refuses it (the run was admitted once already),
 * and a waiting caller takes none of the user's places for held runs. `wait` works as when the
 * run was created: by default a default-class caller is held until the run ends or pauses
 * again (at most AGENT_SYNC_TIMEOUT_MS, then 202), a deferred one gets 202 at once.
 */
export function resumeRoute(api: FastifyInstance, ctx: RouteContext): void {
  api.post<{ Params: { id: string }; Body: ResumeBody }>(
    '/agents/runs/:id/resume',
    { schema: { summary: 'Resume a run waiting for approvals', params: runParams } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'resume runs');
      const body = (request.body ?? {}) as ResumeBody;
      if (typeof body !== 'object' || Array.isArray(body))
        throw badRequest('Expected a JSON object with `approvals`', { field: 'approvals' });
      const run = await getRun(ctx.db, who.tenant, request.params.id);
      if (!run) throw notFound(`No run \`${shown(request.params.id)}\``);
      if (!mayCancel(who, run)) {
        throw new HttpError(
          403,
          'permission_denied',
          `Run ${run.id} belongs to another project; an admin token can resume it`,
        );
      }
      if (run.status !== 'requires_action') throw notPaused(run);
      if (body.wait !== undefined && typeof body.wait !== 'boolean')
        throw badRequest(`Expected \`wait\` to be true or false, got \`${shown(body.wait)}\``, {
          field: 'wait',
        });
      const approvals = checkApprovals(run, body.approvals);
      const resumed = await resumeRun(ctx.db, who.tenant, run.id, approvals, run.required_action);
      // Another resume (or a cancel) moved it first.
      if (!resumed) throw notPaused((await getRun(ctx.db, who.tenant, run.id)) ?? run);
      ctx.executor.notify(resumed.class);
      const wait = body.wait ?? resumed.class === 'default';
      if (!wait) return reply.status(202).send(toApiRun(resumed));
      const waited = await waitForRun(ctx, resumed, clientGone(reply));
      if (waited.kind === 'draining') throw drainingWithRun(waited.run);
      return reply.status(waited.kind === 'settled' ? 200 : 202).send(toApiRun(waited.run));
    },
  );
}
