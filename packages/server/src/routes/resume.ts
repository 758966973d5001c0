import type { FastifyInstance } from 'fastify';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { resumeRunBody, runParams } from '../http/schemas.js';
import { checkAnswers } from '../runs/answers.js';
import { checkApprovals, decide } from '../runs/approvals.js';
import { mayCancel } from '../runs/cancel.js';
import { invalidInput } from '../runs/refused.js';
import { continues, type Decision } from '../runs/required-action.js';
import { getRun, toApiRun, type RunRow } from '../runs/store.js';
import { waitForRun } from '../runs/submission.js';
import { clientGone } from '../http/client-gone.js';
import type { Principal } from '../store/tokens.js';
import type { RouteContext } from './context.js';
import { drainingWithRun } from './create-run.js';

interface ResumeBody {
  approvals?: unknown;
  answers?: unknown;
  wait?: unknown;
}

/** Tries at a resume whose stage moved under it (another partial answer came first). */
const ATTEMPTS = 3;

const notPaused = (run: RunRow) =>
  run.status === 'requires_action'
    ? new HttpError(
        409,
        'required_action_changed',
        `Run ${run.id} waits for other calls than those this resume answered (another resume came first); read it again and answer what it waits for now`,
        { run_id: run.id, status: run.status, required_action: run.required_action },
      )
    : new HttpError(
        409,
        'run_not_requires_action',
        `Run ${run.id} is ${run.status}: only a run in requires_action can be resumed`,
        { run_id: run.id, status: run.status },
      );

/**
 * The decisions of a resume, checked against the stage the run shows: `approvals` for
 * `approve_tool_calls`, `answers` for `answer_question`, and never the other.
 */
function checkedDecisions(run: RunRow, body: { approvals?: unknown; answers?: unknown }): Decision[] {
  const waitsFor = run.required_action?.type === 'answer_question' ? 'answers' : 'approvals';
  const other = waitsFor === 'answers' ? 'approvals' : 'answers';
  if (body[other] !== undefined) {
    throw invalidInput(
      `Run ${run.id} waits for ${waitsFor === 'answers' ? 'answers to its questions' : 'approvals of its tool calls'}: send \`${waitsFor}\`, not \`${other}\``,
      other,
    );
  }
  return waitsFor === 'answers' ? checkAnswers(run, body.answers) : checkApprovals(run, body.approvals);
}

/**
 * The resume service, for every front that answers a paused run (the runs API's resume, AG-UI's
 * resume entries): checks who asks (the cancel rule: a member resumes its project's runs, an
 * admin any) and that the run waits, records the decisions (`approvals` or `answers`, see
 * `checkedDecisions`), and once every call of the stage is decided puts the run back in the
 * queue and wakes a worker. `resumed: false`: some questions are still open, the run waits on.
 */
export async function answerPausedRun(
  ctx: Pick<RouteContext, 'db' | 'executor'>,
  who: Principal,
  paused: RunRow,
  body: { approvals?: unknown; answers?: unknown },
): Promise<{ run: RunRow; resumed: boolean }> {
  let run = paused;
  if (!mayCancel(who, run)) {
    throw new HttpError(
      403,
      'permission_denied',
      `Run ${run.id} belongs to another project; an admin token can resume it`,
    );
  }
  if (run.status !== 'requires_action') throw notPaused(run);
  let moved = await decide(ctx.db, run, checkedDecisions(run, body));
  for (let attempt = 1; !moved; attempt++) {
    // Another resume (or a cancel) moved it first. Only another partial answer to the same
    // questions lets this one be checked again, against the questions left.
    const now = await getRun(ctx.db, run.tenant, run.id);
    if (!now || attempt === ATTEMPTS || !continues(run.required_action, now.required_action))
      throw notPaused(now ?? run);
    run = now;
    moved = await decide(ctx.db, run, checkedDecisions(run, body));
  }
  if (moved.resumed) ctx.executor.notify(moved.run.class);
  return moved;
}

/**
 * `POST /agents/runs/:id/resume`: answers the pending calls of a paused run and, once every
 * call of its turn is decided, puts it back in the queue, where it keeps its place. A resume
 * that leaves some questions open keeps the run waiting on those (200, still
 * requires_action). No cap refuses it (the run was admitted once already), and a waiting
 * caller takes none of the user's places for held runs. `wait` works as when the run was
 * created: by default a default-class caller is held until the run ends or pauses again (at
 * most AGENT_SYNC_TIMEOUT_MS, then 202), a deferred one gets 202 at once.
 */
export function resumeRoute(api: FastifyInstance, ctx: RouteContext): void {
  api.post<{ Params: { id: string }; Body: ResumeBody }>(
    '/agents/runs/:id/resume',
    {
      schema: {
        summary: 'Resume a run waiting for approvals or answers',
        params: runParams,
        body: resumeRunBody,
      },
    },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'resume runs');
      const body = (request.body ?? {}) as ResumeBody;
      if (typeof body !== 'object' || Array.isArray(body))
        throw badRequest('Expected a JSON object with `approvals` or `answers`', { field: 'approvals' });
      const run = await getRun(ctx.db, who.tenant, request.params.id);
      if (!run) throw notFound(`No run \`${shown(request.params.id)}\``);
      if (body.wait !== undefined && typeof body.wait !== 'boolean')
        throw badRequest(`Expected \`wait\` to be true or false, got \`${shown(body.wait)}\``, {
          field: 'wait',
        });
      const moved = await answerPausedRun(ctx, who, run, body);
      if (!moved.resumed) return reply.status(200).send(toApiRun(moved.run));
      const resumed = moved.run;
      const wait = body.wait ?? resumed.class === 'default';
      if (!wait) return reply.status(202).send(toApiRun(resumed));
      const waited = await waitForRun(ctx, resumed, clientGone(reply));
      if (waited.kind === 'draining') throw drainingWithRun(waited.run);
      return reply.status(waited.kind === 'settled' ? 200 : 202).send(toApiRun(waited.run));
    },
  );
}
