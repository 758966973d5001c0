import type { FastifyInstance } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { clientGone } from '../http/client-gone.js';
import { notFound, shown } from '../http/errors.js';
import { agentParams } from '../http/schemas.js';
import type { RouteContext } from '../routes/context.js';
import { EventStream, playRun } from '../routes/stream-run.js';
import { onOpenedThread, submitHeld } from '../runs/submission.js';
import { AgUiEvents } from './events.js';
import { runAgentInputSchema, splitConversation, type RunAgentInput } from './input.js';
import { resumeOverAgUi } from './resume.js';
import { threadOfAgUi } from './threads.js';

/**
 * `POST /agents/:agent/ag-ui`: an AG-UI run, answered with AG-UI events over Server-Sent Events.
 * It is a held run like a stream of the runs API: the user's place, the thread (`threadId`, see
 * `threadOfAgUi`) and admission are checked before the stream opens, so a refusal is the plain
 * JSON error; a client that goes away leaves the run going. A request with `resume` entries
 * answers the run the thread waits on instead (see agui/resume.ts).
 */
export function agUiRoutes(api: FastifyInstance, ctx: RouteContext): void {
  api.post<{ Params: { agent: string }; Body: RunAgentInput }>(
    '/agents/:agent/ag-ui',
    {
      schema: {
        summary: 'Run an agent for an AG-UI client',
        params: agentParams,
        body: runAgentInputSchema,
      },
    },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'create runs');
      const name = request.params.agent;
      if (!agentFor(ctx.config, who.tenant, name)) throw notFound(`No agent \`${shown(name)}\``);
      const body = request.body;
      // Answers to the interrupts a paused run of the thread ended with: that run goes on.
      if (body.resume !== undefined && body.resume.length > 0)
        return resumeOverAgUi(ctx, who, name, { ...body, resume: body.resume }, reply);
      const { history, turn } = splitConversation(body.messages);
      const signal = clientGone(reply);
      const { done } = await onOpenedThread(
        () => threadOfAgUi(ctx.db, who, body.threadId, history),
        (thread) =>
          submitHeld(
            ctx,
            who,
            {
              agent: name,
              inputField: 'messages',
              class: 'default',
              input: turn,
              threadId: thread!.id,
              newThread: thread!.created,
            },
            {
              signal,
              play: (run) => {
                const stream = new EventStream(reply, ctx.settings.streamKeepAliveMs);
                const events = new AgUiEvents(body.threadId, body.runId, (event) => stream.data(event));
                return playRun(ctx.executor, run, ctx.db, events.send).finally(() => stream.end());
              },
            },
          ),
      );
      void done.catch(() => undefined);
      return reply;
    },
  );
}
