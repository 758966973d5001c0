import type { FastifyInstance, FastifyRequest } from 'fastify';
import { generateSigningSecret } from '../callbacks/signing.js';
import { agentFor } from '../config.js';
import type { CacheStore } from '../cache/store.js';
import { countedRefusal, requireRole } from '../http/auth.js';
import { HttpError, badRequest, notFound, refusalOf, shown } from '../http/errors.js';
import { storableText } from '../http/schemas.js';
import type { RunClass } from '../runs/lifecycle.js';
import { toApiRun } from '../runs/store.js';
import { cronProblem, nextTick } from '../triggers/cron.js';
import { inputOf, queueTriggerRun, runOf } from '../triggers/runs.js';
import {
  countTriggers,
  deleteTrigger,
  deliveredRun,
  findTrigger,
  insertTrigger,
  isUniqueViolation,
  listTriggers,
  recordDelivery,
  type TriggerRow,
} from '../triggers/store.js';
import { verifyDelivery } from '../triggers/verify.js';
import type { RouteContext } from './context.js';

/** Triggers one tenant may have: each schedule is looked at by every process every second. */
export const MAX_TRIGGERS_PER_TENANT = 1_000;

interface CreateTriggerBody {
  name: string;
  agent: string;
  class?: RunClass;
  schedule?: string;
  input?: string;
}

const createTriggerBody = {
  type: 'object',
  required: ['name', 'agent'],
  additionalProperties: false,
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 128, pattern: storableText },
    agent: { type: 'string', minLength: 1, maxLength: 64 },
    class: { type: 'string', enum: ['default', 'deferred'] },
    schedule: {
      type: 'string',
      minLength: 1,
      maxLength: 200,
      description: 'Five-field cron (minute hour day-of-month month day-of-week) or @hourly, @daily...; UTC.',
    },
    input: {
      type: 'string',
      minLength: 1,
      maxLength: 100_000,
      pattern: storableText,
      description: "Text put before the event in every run's input.",
    },
  },
} as const;

const triggerParams = {
  type: 'object',
  required: ['id'],
  properties: { id: { type: 'string', maxLength: 200 } },
} as const;

/** The public URL of a trigger's webhook, as the admin who asked reached this server. */
const webhookUrl = (request: FastifyRequest, id: string) =>
  `${request.protocol}://${request.host}/api/client/v1/triggers/${id}/webhook`;

const toApiTrigger = (t: TriggerRow, request: FastifyRequest) => ({
  id: t.id,
  object: 'trigger' as const,
  name: t.name,
  agent: t.agent,
  class: t.class,
  schedule: t.schedule,
  input: t.input,
  url: webhookUrl(request, t.id),
  created_at: Math.floor(t.created_ms / 1000),
});

/** `POST/GET/DELETE /triggers`, behind the bearer token, admins only. */
export function triggerRoutes(api: FastifyInstance, ctx: RouteContext): void {
  const { db } = ctx;

  api.post<{ Body: CreateTriggerBody }>(
    '/triggers',
    { schema: { summary: 'Create a trigger', body: createTriggerBody } },
    async (request, reply) => {
      const who = request.principal;
      requireRole(who, 'admin', 'manage triggers');
      const body = request.body;
      if (!agentFor(ctx.config, who.tenant, body.agent))
        throw badRequest(`Expected \`agent\` to name an agent of this tenant, got \`${shown(body.agent)}\``, {
          field: 'agent',
          value: body.agent,
        });
      if (body.schedule !== undefined) {
        const problem = cronProblem(body.schedule);
        if (problem)
          throw badRequest(
            `Expected \`schedule\` to be a cron expression, got \`${shown(body.schedule)}\`: ${problem}`,
            {
              field: 'schedule',
              value: body.schedule,
            },
          );
      }
      const count = await countTriggers(db, who.tenant);
      if (count >= MAX_TRIGGERS_PER_TENANT)
        throw badRequest(
          `The tenant already has ${count} triggers; the limit is ${MAX_TRIGGERS_PER_TENANT}`,
          {
            field: 'name',
            limit: 'max_triggers',
            limit_value: MAX_TRIGGERS_PER_TENANT,
            value: count,
          },
        );
      const secret = generateSigningSecret();
      const nextTickMs = body.schedule === undefined ? undefined : nextTick(body.schedule, ctx.clock.now());
      const trigger = await insertTrigger(db, {
        tenant: who.tenant,
        project: who.project,
        user: who.user,
        name: body.name,
        agent: body.agent,
        class: body.class ?? 'default',
        schedule: body.schedule?.trim(),
        nextTickMs,
        input: body.input,
        secret,
      });
      ctx.triggerTicks?.made(nextTickMs);
      // The only time the secret is shown: list and get never carry it.
      return reply.status(201).send({ ...toApiTrigger(trigger, request), secret });
    },
  );

  api.get('/triggers', { schema: { summary: "The tenant's triggers" } }, async (request) => {
    requireRole(request.principal, 'admin', 'manage triggers');
    const rows = await listTriggers(db, request.principal.tenant);
    return { object: 'list', data: rows.map((t) => toApiTrigger(t, request)) };
  });

  api.delete<{ Params: { id: string } }>(
    '/triggers/:id',
    { schema: { summary: 'Delete a trigger', params: triggerParams } },
    async (request) => {
      requireRole(request.principal, 'admin', 'manage triggers');
      const { id } = request.params;
      if (!(await deleteTrigger(db, request.principal.tenant, id)))
        throw notFound(`No trigger \`${shown(id)}\``);
      return { id, object: 'trigger', deleted: true };
    },
  );
}

/** One answer for every refusal, so a caller cannot tell a real trigger id from a made-up one. */
const refused = () =>
  new HttpError(
    401,
    'webhook_signature_invalid',
    "The webhook's signature is missing, does not match, or is too old, or there is no such trigger",
  );

/** Bodies are taken as bytes (the signature covers them exactly); text must be UTF-8 a run can store. */
function bodyText(raw: Buffer): string {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(raw);
  } catch {
    throw badRequest('The webhook body is not UTF-8 text', { field: 'body' });
  }
  if (text.includes('\u0000'))
    throw badRequest('The webhook body holds a U+0000 character', { field: 'body' });
  return text;
}

/**
 * `POST /triggers/:id/webhook`: no bearer token; the sender's signature over the raw body is the
 * credential. Registered in a plugin of its own, where every content type is read as bytes.
 */
export function webhookRoutes(ctx: RouteContext, now: () => number, cache: CacheStore) {
  // A refusal counts against the sender's address with failed token authentications: past the
  // limit it is 429, so guessing trigger ids or secrets is as slow as guessing tokens. A delivery
  // that verifies is still let in, so a sender is not locked out by another's failures.
  const refuse = countedRefusal(cache);
  return async (scope: FastifyInstance) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));

    // The trigger is looked up before the body is read: a made-up id costs no upload of up to
    // 10 MB. Trigger ids are 96 random bits, so answering those sooner tells nobody anything.
    const found = new WeakMap<FastifyRequest, TriggerRow>();
    scope.post<{ Params: { id: string }; Body: Buffer | undefined }>(
      '/triggers/:id/webhook',
      {
        schema: {
          summary: "A trigger's webhook (signed; no bearer token)",
          params: triggerParams,
          security: [],
        },
        onRequest: async (request) => {
          const trigger = await findTrigger(ctx.db, (request.params as { id: string }).id);
          if (!trigger) throw await refuse(request, refused());
          found.set(request, trigger);
        },
      },
      async (request, reply) => {
        const raw = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
        const trigger = found.get(request);
        if (!trigger) throw refused();
        const verified = verifyDelivery(trigger.secret, request.headers, raw, now());
        if (!verified.ok) {
          request.log.info({ trigger: trigger.id, reason: verified.reason }, 'webhook refused');
          throw await refuse(request, refused());
        }
        const answer = async (runId: string) => {
          const run = await runOf(ctx, trigger, runId);
          if (!run) throw notFound(`The run of this delivery, ${runId}, is gone`);
          return reply.status(202).send(toApiRun(run));
        };
        const earlier = await deliveredRun(ctx.db, trigger.id, verified.key);
        if (earlier) return answer(earlier);
        try {
          const run = await queueTriggerRun(
            ctx,
            trigger,
            inputOf(trigger, bodyText(raw)),
            { trigger_id: trigger.id },
            (tx, created) => recordDelivery(tx, trigger.id, verified.key, created.id),
          );
          return reply.status(202).send(toApiRun(run));
        } catch (error) {
          // A copy of this delivery got in first (on this process or another): its run is the answer.
          // That copy may also have taken the last place under a cap, so this one was refused (429):
          // the refusal was decided after that copy committed, so its row is there to be found.
          const refusedByCap = refusalOf(error)?.status === 429;
          if (!isUniqueViolation(error) && !refusedByCap) throw error;
          const first = await deliveredRun(ctx.db, trigger.id, verified.key);
          if (!first) throw error;
          return answer(first);
        }
      },
    );
  };
}
