import type { FastifyInstance } from 'fastify';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import { clientGone } from '../http/client-gone.js';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { CANCEL_CONFIRM_MS, cancelRun, mayCancel } from '../runs/cancel.js';
import { isFinal, isSettled } from '../runs/lifecycle.js';
import { getRun, type RunRow } from '../runs/store.js';
import {
  submitAndWait,
  submitHeld,
  submitInline,
  onOpenedThread,
  submitQueued,
  type RunRequest,
} from '../runs/submission.js';
import type { RouteContext } from '../routes/context.js';
import { threadOfChain } from './chains.js';
import { agentOfModel, chatInput, responsesInput, type RunMessage } from './input.js';
import { interrupted, wasInterrupted } from './interrupted.js';
import { requiresAction } from './paused.js';
import { toChatCompletion, toResponse, type ResponseRequest } from './render.js';
import { createChatBody, createResponseBody, responseParams } from './schemas.js';
import { streamChat, streamResponse } from './streams.js';
import { windowFor } from './window.js';

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
      const previousId = body.previous_response_id;
      const chain = () =>
        typeof previousId === 'string' ? threadOfChain(db, who, previousId) : Promise.resolve(undefined);
      const asked: ResponseRequest = {
        model: body.model,
        instructions: body.instructions ?? null,
        background,
        service_tier: flex ? 'flex' : 'default',
        previous_response_id: body.previous_response_id ?? null,
      };
      // The chain's thread is opened with the submission: again if another follow-up's refusal removed it.
      const submitted = <T>(submit: (submission: RunRequest) => Promise<T>): Promise<T> =>
        onOpenedThread(chain, (thread) =>
          submit({
            agent,
            class: flex ? 'deferred' : 'default',
            input,
            metadata: body.metadata ?? undefined,
            threadId: thread?.id,
            newThread: thread?.created,
            reopenThread: thread?.reopen,
            apiRequest: { ...asked },
          }),
        );
      const signal = clientGone(reply);
      const windowMs = windowFor(request.headers, settings.syncTimeoutMs);
      if (background) return toResponse(await submitted((s) => submitQueued(ctx, who, s)));
      if (flex) {
        const { run } = await submitted((s) => submitAndWait(ctx, who, s, { signal, windowMs }));
        if (wasInterrupted(run)) throw interrupted(run);
        return reply.status(isSettled(run.status) ? 200 : 202).send(toResponse(run));
      }
      if (body.stream) {
        const { done } = await submitted((s) =>
          submitHeld(ctx, who, s, {
            signal,
            play: (run) =>
              streamResponse(reply, executor, run, { db, keepAliveMs: settings.streamKeepAliveMs }),
          }),
        );
        void done.catch(() => undefined);
        return reply;
      }
      const { run: final } = await submitted((s) => submitInline(ctx, who, s, { signal, windowMs }));
      if (wasInterrupted(final)) throw interrupted(final);
      return reply.status(isSettled(final.status) ? 200 : 202).send(toResponse(final));
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
      const submission: RunRequest = {
        agent,
        inputField: 'messages',
        class: flex ? 'deferred' : 'default',
        input,
        metadata: body.metadata ?? undefined,
        apiRequest: { model: body.model, api: 'chat.completions' },
      };
      const signal = clientGone(reply);
      const windowMs = windowFor(request.headers, settings.syncTimeoutMs);
      let final: RunRow;
      if (flex) {
        final = (await submitAndWait(ctx, who, submission, { signal, windowMs })).run;
      } else if (body.stream) {
        const { done } = await submitHeld(ctx, who, submission, {
          signal,
          play: (run) =>
            streamChat(reply, executor, run, {
              db,
              keepAliveMs: settings.streamKeepAliveMs,
              model: body.model,
              includeUsage: body.stream_options?.include_usage === true,
            }),
        });
        void done.catch(() => undefined);
        return reply;
      } else {
        final = (await submitInline(ctx, who, submission, { signal, windowMs })).run;
      }
      if (final.status === 'succeeded') return toChatCompletion(final, body.model);
      if (final.status === 'requires_action') throw requiresAction(final);
      if (wasInterrupted(final)) throw interrupted(final);
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
