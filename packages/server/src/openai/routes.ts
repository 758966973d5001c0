import type { FastifyInstance } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { CANCEL_CONFIRM_MS, cancelRun, mayCancel } from '../runs/cancel.js';
import { isFinal } from '../runs/lifecycle.js';
import { getRun, type RunRow } from '../runs/store.js';
import type { RouteContext } from '../routes/context.js';
import {
  admitHeld,
  admitQueued,
  clientGone,
  newRunOf,
  takePlace,
  waitForHeld,
  waitForQueued,
  windowFor,
} from '../routes/submit.js';
import { threadOfChain } from './chains.js';
import { agentOfModel, chatInput, responsesInput, type RunMessage } from './input.js';
import { toChatCompletion, toResponse, type ResponseRequest } from './render.js';
import { createChatBody, createResponseBody, responseParams } from './schemas.js';
import { streamChat, streamResponse } from './streams.js';

interface CreateResponseBody {
  model: string;
  input: unknown;
  instructions?: string | null;
  metadata?: Record<string, string> | null;
  background?: boolean | null;
  service_tier?: string | null;
  stream?: boolean | null;
  previous_response_id?: string | null;
}

interface CreateChatBody {
  model: string;
  messages: { role?: unknown; content?: unknown }[];
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean } | null;
  service_tier?: string | null;
  metadata?: Record<string, string> | null;
}

/**
 * The OpenAI-compatible endpoints, for the official `openai` client with
 * `baseURL: <server>/api/client/v1`: Responses (create, retrieve, cancel, streamed) and Chat
 * Completions. Each request is a run of the agent its `model` names (`agent:NAME`), through the
 * same admission as the runs API: every cap, quota and limit applies, and refusals keep the
 * error body the client reads. `service_tier: 'flex'` runs in the deferred class.
 */
export function openAiRoutes(api: FastifyInstance, ctx: RouteContext): void {
  const { db, executor, settings } = ctx;
  const agentNamed = (tenant: string, model: string) =>
    agentOfModel(model, (name) => agentFor(ctx.config, tenant, name) !== undefined);

  api.post<{ Body: CreateResponseBody }>(
    '/responses',
    { schema: { summary: 'Create a response (OpenAI Responses API)', body: createResponseBody } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'create responses');
      const body = request.body;
      const agent = agentNamed(who.tenant, body.model);
      const given = responsesInput(body.input);
      checkInput(given as Parameters<typeof checkInput>[0], 'input');
      const input: string | RunMessage[] =
        typeof body.instructions === 'string' && body.instructions !== ''
          ? [
              { role: 'system', content: body.instructions },
              ...(typeof given === 'string' ? [{ role: 'user' as const, content: given }] : given),
            ]
          : given;
      // The input alone was within the limits: past them now, the instructions took it there.
      if (input !== given) checkInput(input as Parameters<typeof checkInput>[0], 'instructions');
      const flex = body.service_tier === 'flex';
      const background = body.background === true;
      if (body.stream && (background || flex)) {
        throw badRequest('A streamed response is held for its caller: it cannot be `background` or `flex`', {
          field: 'stream',
        });
      }
      const threadId =
        typeof body.previous_response_id === 'string'
          ? await threadOfChain(db, who, body.previous_response_id)
          : undefined;
      const asked: ResponseRequest = {
        model: body.model,
        instructions: body.instructions ?? null,
        background,
        service_tier: flex ? 'flex' : 'default',
        previous_response_id: body.previous_response_id ?? null,
      };
      const held = !background && !flex;
      const newRun = await newRunOf(ctx, who, {
        agent,
        class: flex ? 'deferred' : 'default',
        held,
        input,
        metadata: body.metadata ?? undefined,
        threadId,
        apiRequest: { ...asked },
      });
      const gone = clientGone(reply);
      if (!held) {
        if (background) return toResponse(await admitQueued(ctx, who, newRun));
        const release = await takePlace(ctx, who, newRun.class);
        const { run: current } = await admitQueued(ctx, who, newRun)
          .then((run) => waitForQueued(ctx, run, gone, windowFor(request.headers, settings.syncTimeoutMs)))
          .finally(release);
        return reply.status(isFinal(current.status) ? 200 : 202).send(toResponse(current));
      }
      const { run, release } = await admitHeld(ctx, who, newRun, { signal: gone });
      if (body.stream) {
        void streamResponse(reply, executor, run, { db, keepAliveMs: settings.streamKeepAliveMs })
          .finally(release)
          .catch(() => undefined);
        return reply;
      }
      const finished = executor.execute(run);
      void finished.finally(release).catch(() => undefined);
      const final = await waitForHeld(ctx, run, finished, windowFor(request.headers, settings.syncTimeoutMs));
      return reply.status(isFinal(final.status) ? 200 : 202).send(toResponse(final));
    },
  );

  const responseOf = async (tenant: string, id: string): Promise<RunRow> => {
    const run = await getRun(db, tenant, id);
    if (!run) throw notFound(`No response \`${shown(id)}\``);
    return run;
  };

  api.get<{ Params: { id: string }; Querystring: { stream?: string } }>(
    '/responses/:id',
    { schema: { summary: 'A response', params: responseParams } },
    async (request) => {
      const response = toResponse(await responseOf(request.principal.tenant, request.params.id));
      // A stream of a response already under way is not kept: say so rather than answer JSON
      // to a client that reads events.
      if (request.query.stream !== undefined && request.query.stream !== 'false') {
        throw badRequest('A response is streamed only by the request that creates it (`stream: true`)', {
          field: 'stream',
        });
      }
      return response;
    },
  );

  api.post<{ Params: { id: string } }>(
    '/responses/:id/cancel',
    { schema: { summary: 'Cancel a background response', params: responseParams } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'cancel responses');
      const run = await responseOf(who.tenant, request.params.id);
      if (run.api_request?.background !== true) {
        throw badRequest(
          `Response ${run.id} was not created with \`background: true\`; only those can be cancelled`,
          {
            field: 'id',
          },
        );
      }
      if (!mayCancel(who, run)) {
        throw new HttpError(403, 'permission_denied', `Response ${run.id} belongs to another project`);
      }
      const current = await cancelRun(ctx, run, { confirmMs: CANCEL_CONFIRM_MS, signal: clientGone(reply) });
      return toResponse(current);
    },
  );

  api.post<{ Body: CreateChatBody }>(
    '/chat/completions',
    { schema: { summary: 'Create a chat completion (OpenAI Chat Completions API)', body: createChatBody } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'member', 'create chat completions');
      const body = request.body;
      const agent = agentNamed(who.tenant, body.model);
      const input = chatInput(body.messages);
      checkInput(input, 'messages');
      const flex = body.service_tier === 'flex';
      if (body.stream && flex) {
        throw badRequest('A streamed completion is held for its caller: it cannot be `flex`', {
          field: 'stream',
        });
      }
      const newRun = await newRunOf(ctx, who, {
        agent,
        inputField: 'messages',
        class: flex ? 'deferred' : 'default',
        held: !flex,
        input,
        metadata: body.metadata ?? undefined,
        apiRequest: { model: body.model, api: 'chat.completions' },
      });
      const gone = clientGone(reply);
      let final: RunRow;
      if (flex) {
        const release = await takePlace(ctx, who, newRun.class);
        final = (
          await admitQueued(ctx, who, newRun)
            .then((run) => waitForQueued(ctx, run, gone, windowFor(request.headers, settings.syncTimeoutMs)))
            .finally(release)
        ).run;
      } else {
        const { run, release } = await admitHeld(ctx, who, newRun, { signal: gone });
        if (body.stream) {
          void streamChat(reply, executor, run, {
            db,
            keepAliveMs: settings.streamKeepAliveMs,
            model: body.model,
            includeUsage: body.stream_options?.include_usage === true,
          })
            .finally(release)
            .catch(() => undefined);
          return reply;
        }
        const finished = executor.execute(run);
        void finished.finally(release).catch(() => undefined);
        final = await waitForHeld(ctx, run, finished, windowFor(request.headers, settings.syncTimeoutMs));
      }
      if (final.status === 'succeeded') return toChatCompletion(final, body.model);
      if (!isFinal(final.status)) return reply.status(202).send(toChatCompletion(final, body.model));
      // The run ran: sending the same messages again is a new run, not a retry of a lost
      // request, so the client is told not to retry on its own (it obeys x-should-retry).
      const noRetry = { 'x-should-retry': 'false' };
      if (final.error?.type === 'timeout') {
        throw new HttpError(
          504,
          'run_timeout',
          `Run ${final.id} passed its timeout and was stopped`,
          { run_id: final.id },
          noRetry,
        );
      }
      throw new HttpError(
        final.status === 'canceled' ? 409 : 502,
        final.status === 'canceled' ? 'run_canceled' : 'run_failed',
        final.error
          ? `Run ${final.id} failed: ${final.error.type}: ${final.error.message}`
          : `Run ${final.id} was canceled`,
        { run_id: final.id },
        noRetry,
      );
    },
  );
}
