import swagger from '@fastify/swagger';
import Fastify, {
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyServerOptions,
} from 'fastify';
import type { SluiceConfig } from './config.js';
import { authenticate } from './http/auth.js';
import { draining, installErrorHandling } from './http/errors.js';
import { requestLimits } from './http/limits.js';
import { installJsonBody } from './http/json-body.js';
import { installProtocolHandling, protocolOptions } from './http/protocol.js';
import { NodeUpkeep } from './node/upkeep.js';
import { interruptRuns, leave } from './node/nodes.js';
import { opsRoutes } from './routes/ops.js';
import type { RouteContext } from './routes/context.js';
import { runRoutes } from './routes/runs.js';
import { RunEvents } from './runs/events.js';
import { Executor } from './runs/executor.js';
import { tenantPolicy } from './runs/policy.js';
import { RunWaiters } from './runs/waiters.js';
import type { ServerSettings } from './settings.js';
import type { Store } from './store/store.js';

export interface ServerApp {
  readonly fastify: FastifyInstance;
  readonly executor: Executor;
  readonly upkeep: NodeUpkeep;
  readonly waiters: RunWaiters;
  /** Starts the background work: notifications, heartbeat and sweeps, queue workers. Call after listening. */
  start(): Promise<void>;
  /**
   * SIGTERM: refuse new work (503 on every route, /readyz 503), answer waiting callers, give
   * local runs `AGENT_RUN_DRAIN_TIMEOUT_MS`, mark the rest `interrupted` (their callers get 503
   * agent_run_interrupted), then close. The heartbeat goes on until the end. Returns the
   * interrupted run ids.
   */
  drain(): Promise<string[]>;
  /** Stops now: local runs end `interrupted`. */
  close(): Promise<void>;
}

export interface AppOptions {
  store: Store;
  config: SluiceConfig;
  settings: ServerSettings;
  /** Fastify's logger option (pino); default: JSON at info, or SLUICE_LOG_LEVEL. */
  logger?: FastifyServerOptions['logger'];
  /** Vets callback destinations; default: http(s) URLs without credentials. */
  checkCallbackUrl?: RouteContext['checkCallbackUrl'];
}

/**
 * The HTTP app: plugins, routes, auth and the one error handler. Builds the executor and the
 * waiters but starts nothing in the background, so it can be tested with `fastify.inject`.
 */
export async function createApp(options: AppOptions): Promise<ServerApp> {
  const { store, config, settings } = options;
  const db = store.db;
  const fastify = Fastify({
    logger: options.logger ?? {
      level: process.env.SLUICE_LOG_LEVEL ?? 'info',
      redact: { paths: ['req.headers.authorization', 'req.headers.cookie'], censor: '[redacted]' },
    },
    bodyLimit: requestLimits.bodyBytes,
    // Receiving a whole request (headers and body) may take this long; a client that trickles
    // a body is cut off. Held responses are not bounded by it.
    requestTimeout: 30_000,
    // An idle socket is closed after this; a held call stays under it.
    connectionTimeout: Math.min(settings.syncTimeoutMs + 60_000, 2 ** 31 - 1),
    routerOptions: { maxParamLength: 500 },
    ajv: {
      customOptions: { removeAdditional: false, coerceTypes: false, useDefaults: false, allErrors: false },
    },
    ...protocolOptions,
  });
  fastify.server.maxConnections = settings.maxConnections;
  fastify.server.headersTimeout = 10_000;
  const log = (level: 'info' | 'warn' | 'error', message: string, fields: object = {}) =>
    (fastify.log as FastifyBaseLogger)[level](fields, message);
  installErrorHandling(fastify, log);
  installProtocolHandling(fastify);

  installJsonBody(fastify);

  let isDraining = false;
  // Registered before any route plugin, so every route inherits it, whatever its path spelling.
  fastify.addHook('onRequest', async (request) => {
    if (isDraining && request.routeOptions.url !== '/readyz') throw draining();
  });

  await fastify.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: { title: 'Sluice run server', version: '1' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  });

  const events = new RunEvents(db, (message, error) => log('warn', message, { error: String(error) }));
  const waiters = new RunWaiters(db, events);
  const executor = new Executor(db, config, settings, waiters, events, log);
  const limitsFor = tenantPolicy(config, settings);
  const upkeep = new NodeUpkeep(db, executor, settings, limitsFor, log);
  const ctx: RouteContext = {
    db,
    config,
    settings,
    executor,
    waiters,
    limitsFor,
    checkCallbackUrl: options.checkCallbackUrl ?? basicCallbackCheck,
    isDraining: () => isDraining,
  };

  opsRoutes(fastify, { store, isDraining: () => isDraining });
  await fastify.register(
    async (api) => {
      api.addHook('onRequest', authenticate(db));
      runRoutes(api, ctx);
    },
    { prefix: '/api/client/v1' },
  );

  let started = false;
  let ended: Promise<string[]> | undefined;
  const finish = async (drainMs: number) => {
    isDraining = true;
    waiters.closeAll();
    const stopping = executor.stopWorkers();
    const left = await executor.settle(drainMs);
    let interruptedIds: string[] = [];
    if (left.length > 0) {
      interruptedIds = await interruptRuns(db, executor.node, left).catch(() => []);
      await executor.stopAll('interrupted');
    }
    await stopping;
    await executor.close();
    await fastify.close();
    upkeep.stop();
    await events.stop();
    if (started) await leave(db, executor.node).catch(() => undefined);
    return interruptedIds;
  };
  return {
    fastify,
    executor,
    upkeep,
    waiters,
    async start() {
      await upkeep.start();
      started = true;
      await events.start();
      executor.startWorkers();
    },
    drain() {
      return (ended ??= finish(settings.drainTimeoutMs));
    },
    async close() {
      await (ended ??= finish(0));
    },
  };
}

/** The check used when no stricter one is wired in: an http(s) URL without credentials. */
async function basicCallbackCheck(
  raw: string,
): Promise<{ ok: true; url: string } | { ok: false; message: string }> {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return { ok: false, message: 'Expected `callback_url` to be an absolute http(s) URL' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    return { ok: false, message: 'Expected `callback_url` to use http or https' };
  if (url.username || url.password)
    return { ok: false, message: 'Expected `callback_url` without credentials in it' };
  return { ok: true, url: url.href };
}
