import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import type { SluiceConfig } from './config.js';
import { HttpError, badRequest, notFound } from './errors.js';
import { Executor } from './runs/executor.js';
import { admitRun, finishRun, getRun, listRuns, present, queueCounts, type RunRow } from './runs/store.js';
import type { ServerSettings } from './settings.js';
import type { Store } from './store/store.js';
import { findToken, type Principal } from './store/tokens.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal;
  }
}

const maxDelaySeconds = 365 * 24 * 3600;

/** `run_at` (ISO 8601 or epoch seconds) or `delay_seconds`, as epoch ms; undefined for now. */
function scheduleOf(fields: Record<string, unknown>): number | undefined {
  const { run_at: runAt, delay_seconds: delay } = fields;
  if (runAt !== undefined && delay !== undefined) {
    throw badRequest('Give `run_at` or `delay_seconds`, not both', { field: 'run_at' });
  }
  if (delay !== undefined) {
    if (typeof delay !== 'number' || !Number.isFinite(delay) || delay < 0 || delay > maxDelaySeconds) {
      throw badRequest(
        `Expected \`delay_seconds\` to be a number between 0 and ${maxDelaySeconds}, got \`${String(delay)}\``,
        {
          field: 'delay_seconds',
        },
      );
    }
    return Date.now() + delay * 1000;
  }
  if (runAt !== undefined) {
    const ms = typeof runAt === 'number' ? runAt * 1000 : typeof runAt === 'string' ? Date.parse(runAt) : NaN;
    if (!Number.isFinite(ms)) {
      throw badRequest(
        `Expected \`run_at\` to be an ISO 8601 time or epoch seconds, got \`${String(runAt)}\``,
        {
          field: 'run_at',
        },
      );
    }
    return ms;
  }
  return undefined;
}

const createFields = new Set([
  'input',
  'class',
  'run_at',
  'delay_seconds',
  'wait',
  'metadata',
  'callback_url',
]);
const statuses = new Set([
  'scheduled',
  'queued',
  'running',
  'requires_action',
  'succeeded',
  'failed',
  'canceled',
]);
const defaultPage = 100;
const maxPage = 1000;

export interface ServerApp {
  readonly fastify: FastifyInstance;
  readonly executor: Executor;
  /**
   * SIGTERM: refuse new work (503), give local runs `AGENT_RUN_DRAIN_TIMEOUT_MS`, mark the
   * rest `interrupted` (callers waiting on them get 503 agent_run_interrupted), then close.
   */
  drain(): Promise<string[]>;
  /** Stops at once. */
  close(): Promise<void>;
}

/** The HTTP app: routes, auth and the one error handler. Testable with `fastify.inject` or a real socket. */
export async function createApp(options: {
  store: Store;
  config: SluiceConfig;
  settings: ServerSettings;
}): Promise<ServerApp> {
  const { store, config, settings } = options;
  const db = store.db;

  const fastify = Fastify({ logger: false, bodyLimit: 10 * 1024 * 1024 });

  fastify.setErrorHandler((error, _request, reply) => {
    if (error instanceof HttpError) {
      return reply.status(error.status).headers(error.headers).send(error.body());
    }
    const status = (error as { statusCode?: number }).statusCode;
    if (status !== undefined && status >= 400 && status < 500) {
      return reply
        .status(status)
        .send({ error: { type: 'invalid_request', message: (error as Error).message } });
    }
    return reply.status(500).send({ error: { type: 'internal_error', message: 'internal error' } });
  });
  fastify.setNotFoundHandler((request, reply) =>
    reply
      .status(404)
      .send({ error: { type: 'not_found', message: `no route ${request.method} ${request.url}` } }),
  );

  fastify.get('/readyz', async () => ({ ready: true }));

  const authenticate = async (request: FastifyRequest) => {
    const header = request.headers.authorization;
    if (!header?.startsWith('Bearer ')) {
      throw new HttpError(401, 'authentication_required', 'Send an API token: Authorization: Bearer <token>');
    }
    const principal = await findToken(db, header.slice(7).trim());
    if (!principal) throw new HttpError(401, 'authentication_required', 'Unknown or revoked API token');
    request.principal = principal;
  };

  const capsFor = (tenant: string) => {
    const quota = config.tenants?.[tenant]?.maxConcurrentAgentRuns;
    const setting = settings.maxActivePerTenant;
    // The effective cap is the smaller of the setting and the tenant's quota (0 = no cap).
    const perTenant = quota === undefined ? setting : setting === 0 ? quota : Math.min(setting, quota);
    const tenantQuota = config.tenants?.[tenant];
    const periodMs = { hour: 3_600_000, day: 86_400_000, month: 30 * 86_400_000 } as const;
    return {
      perTenant,
      perProject: settings.maxActivePerProject,
      deferredQueued: settings.deferredMaxQueuedPerTenant,
      runQuota: tenantQuota?.runs && {
        limit: tenantQuota.runs.limit,
        windowMs: periodMs[tenantQuota.runs.per],
      },
      spend: tenantQuota?.spend && {
        limitUsd: tenantQuota.spend.limitUsd,
        windowMs: periodMs[tenantQuota.spend.per],
      },
    };
  };
  const caps = (who: Principal) => capsFor(who.tenant);
  // When a run with a callback_url ends, POST it there: a few tries with backoff, then give up
  // (the run itself is in the store either way).
  const sendCallback = async (run: RunRow) => {
    for (let attempt = 0; attempt < 4; attempt++) {
      try {
        const response = await fetch(run.callback_url!, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'user-agent': 'sluice-run-server' },
          body: JSON.stringify(present(run)),
          signal: AbortSignal.timeout(10_000),
        });
        if (response.ok) return;
      } catch {
        // try again
      }
      await new Promise((r) => setTimeout(r, 250 * 4 ** attempt));
    }
  };
  const executor = new Executor(db, config.agents, settings, capsFor, sendCallback);

  await fastify.register(
    async (api) => {
      api.addHook('onRequest', authenticate);

      api.post<{ Params: { agent: string } }>('/agents/:agent/runs', async (request, reply) => {
        const who = request.principal;
        if (who.role === 'read')
          throw new HttpError(403, 'permission_denied', 'A read token cannot create runs');
        if (!config.agents[request.params.agent]) throw notFound(`No agent \`${request.params.agent}\``);
        const body = request.body;
        if (typeof body !== 'object' || body === null || Array.isArray(body)) {
          throw badRequest('Expected a JSON object body');
        }
        const fields = body as Record<string, unknown>;
        for (const key of Object.keys(fields)) {
          if (!createFields.has(key)) throw badRequest(`Unknown field \`${key}\``, { field: key });
        }
        if (fields.input === undefined || fields.input === null)
          throw badRequest('Expected `input`', { field: 'input' });
        if (typeof fields.input !== 'string' && typeof fields.input !== 'object') {
          throw badRequest('Expected `input` to be a string or an object', { field: 'input' });
        }
        if (fields.wait !== undefined && typeof fields.wait !== 'boolean') {
          throw badRequest('Expected `wait` to be a boolean', { field: 'wait' });
        }
        if (fields.class !== undefined && fields.class !== 'default' && fields.class !== 'deferred') {
          throw badRequest("Expected `class` to be 'default' or 'deferred'", { field: 'class' });
        }
        let callbackUrl: string | undefined;
        if (fields.callback_url !== undefined) {
          let url: URL | null = null;
          try {
            url = typeof fields.callback_url === 'string' ? new URL(fields.callback_url) : null;
          } catch {
            url = null;
          }
          if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
            throw badRequest(
              `Expected \`callback_url\` to be an http(s) URL, got \`${String(fields.callback_url)}\``,
              {
                field: 'callback_url',
              },
            );
          }
          callbackUrl = url.href;
        }
        const scheduledFor = scheduleOf(fields);
        const runClass = fields.class === 'deferred' ? 'deferred' : 'default';
        const wait = fields.wait !== false;
        // A deferred run is never answered inline: it always goes through its queue.
        const inline = wait && runClass === 'default' && scheduledFor === undefined;
        const run = await admitRun(
          db,
          who,
          {
            agent: request.params.agent,
            class: runClass,
            mode: inline ? 'inline' : 'queued',
            input: fields.input,
            metadata: fields.metadata,
            worker: executor.worker,
            scheduledFor,
            callbackUrl,
          },
          caps(who),
        );
        // A scheduled run is answered at once: it starts when it is due.
        if (scheduledFor !== undefined) return reply.status(202).send(present(run));
        if (!inline) {
          executor.notify();
          if (!wait) return reply.status(202).send(present(run));
          // A caller that waits on a queued run: poll it for them up to the sync window.
          const deadline = Date.now() + settings.syncTimeoutMs;
          let current = run;
          while (Date.now() < deadline) {
            await new Promise((r) => setTimeout(r, Math.min(200, Math.max(0, deadline - Date.now()))));
            current = (await getRun(db, who.tenant, run.id)) ?? current;
            if (['succeeded', 'failed', 'canceled'].includes(current.status))
              return reply.status(200).send(present(current));
          }
          return reply.status(202).send(present(current));
        }
        // Inline: run it here and hold the connection up to the sync window, then answer 202.
        const finished = executor.execute(run);
        let timer: ReturnType<typeof setTimeout> | undefined;
        const window = new Promise<'window'>(
          (resolve) => (timer = setTimeout(() => resolve('window'), settings.syncTimeoutMs)),
        );
        const outcome = await Promise.race([finished, window]);
        clearTimeout(timer);
        const final =
          outcome === 'window' || outcome === undefined ? await getRun(db, who.tenant, run.id) : outcome;
        if (final?.error?.type === 'interrupted') {
          // The server is shutting down and this run could not finish within the drain time.
          throw new HttpError(
            503,
            'agent_run_interrupted',
            `Run ${run.id} was interrupted by a server shutdown`,
            {
              run: present(final),
            },
          );
        }
        if (outcome === 'window' || outcome === undefined)
          return reply.status(202).send(present(final ?? run));
        return reply.status(200).send(present(outcome));
      });

      api.get('/agents/runs/queue', async (request) => {
        const who = request.principal;
        const { count, oldestDeferred } = await queueCounts(db, who.tenant, who.project);
        const figures = (cls: string, mine = false) => ({
          running: count(cls, 'running', mine),
          queued: count(cls, 'queued', mine),
          scheduled: count(cls, 'scheduled', mine),
        });
        return {
          object: 'agent.run_queue',
          default: { ...figures('default'), limit: caps(who).perTenant },
          deferred: {
            ...figures('deferred'),
            running_limit: settings.deferredMaxRunningPerTenant,
            queued_limit: settings.deferredMaxQueuedPerTenant,
            oldest_queued_at: oldestDeferred === null ? null : Math.floor(oldestDeferred),
          },
          project: { default: figures('default', true), deferred: figures('deferred', true) },
        };
      });

      api.get<{ Params: { id: string } }>('/agents/runs/:id', async (request) => {
        const run = await getRun(db, request.principal.tenant, request.params.id);
        // Another tenant's run does not exist, as far as this token can tell.
        if (!run) throw notFound(`No run \`${request.params.id}\``);
        return present(run);
      });

      api.post<{ Params: { id: string } }>('/agents/runs/:id/cancel', async (request) => {
        const who = request.principal;
        if (who.role === 'read')
          throw new HttpError(403, 'permission_denied', 'A read token cannot cancel runs');
        const run = await getRun(db, who.tenant, request.params.id);
        if (!run) throw notFound(`No run \`${request.params.id}\``);
        if (['succeeded', 'failed', 'canceled'].includes(run.status)) return present(run);
        if (executor.cancel(run.id)) {
          return present((await executor.settled(run.id)) ?? (await getRun(db, who.tenant, run.id))!);
        }
        return present(
          (await finishRun(db, run.id, { status: 'canceled' })) ?? (await getRun(db, who.tenant, run.id))!,
        );
      });

      api.get<{ Querystring: Record<string, string | undefined> }>('/agents/runs', async (request) => {
        const q = request.query;
        let limit = defaultPage;
        if (q.limit !== undefined) {
          if (!/^\d+$/.test(q.limit)) {
            throw badRequest(`Expected \`limit\` to be a whole number >= 1, got \`${q.limit}\``, {
              field: 'limit',
            });
          }
          limit = Math.min(maxPage, Math.max(1, Number(q.limit)));
        }
        let after: number | undefined;
        if (q.cursor !== undefined) {
          if (!/^\d+$/.test(q.cursor))
            throw badRequest(`Malformed \`cursor\` \`${q.cursor}\``, { field: 'cursor' });
          after = Number(q.cursor);
        }
        const wanted = q.status?.split(',').filter(Boolean);
        for (const s of wanted ?? [])
          if (!statuses.has(s)) throw badRequest(`Unknown status \`${s}\``, { field: 'status' });
        if (q.class !== undefined && q.class !== 'default' && q.class !== 'deferred') {
          throw badRequest("Expected `class` to be 'default' or 'deferred'", { field: 'class' });
        }
        const rows = await listRuns(db, request.principal.tenant, {
          statuses: wanted,
          class: q.class,
          limit: limit + 1,
          after,
        });
        const page = rows.slice(0, limit);
        return {
          object: 'list',
          data: page.map(present),
          has_more: rows.length > limit,
          next_cursor: rows.length > limit ? String(page.at(-1)!.seq) : null,
        };
      });
    },
    { prefix: '/api/client/v1' },
  );

  await executor.start();
  let readyForWork = true;
  fastify.addHook('onRequest', async (request) => {
    if (!readyForWork && request.url.startsWith('/api/')) {
      throw new HttpError(
        503,
        'server_draining',
        'This server is shutting down; send the request to another one',
      );
    }
  });
  return {
    fastify,
    executor,
    async drain() {
      readyForWork = false;
      const interrupted = await executor.drain();
      await fastify.close();
      return interrupted;
    },
    async close() {
      readyForWork = false;
      await executor.stop();
      await fastify.close();
    },
  };
}
