import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import swagger from '@fastify/swagger';
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyServerOptions } from 'fastify';
import { openCacheStore } from './cache/open.js';
import type { CacheStore } from './cache/store.js';
import { CallbackDispatcher, checkCallbackUrl, dispatcherDefaults } from './callbacks/index.js';
import { agentFor, type SluiceConfig } from './config.js';
import { authenticate } from './http/auth.js';
import { Principals } from './http/principals.js';
import { installErrorHandling } from './http/error-handling.js';
import { draining } from './http/errors.js';
import { requestLimits } from './http/limits.js';
import { installJsonBody } from './http/json-body.js';
import { installProtocolHandling, protocolOptions } from './http/protocol.js';
import { NodeUpkeep } from './node/upkeep.js';
import { leave } from './node/nodes.js';
import { interruptRuns } from './runs/lifecycle.js';
import { appLogger, installRequestId, requestIdOf } from './ops/logging.js';
import { Ops, type OpsOptions } from './ops/index.js';
import { metricsRoutes, metricsTokenOf } from './routes/metrics.js';
import { opsRoutes } from './routes/ops.js';
import type { RouteContext } from './routes/context.js';
import { runRoutes } from './routes/runs.js';
import { checkUpgrade, installWebsocket, wsRoutes, type SocketSession } from './routes/ws.js';
import { agUiRoutes } from './agui/route.js';
import { threadRoutes } from './routes/threads.js';
import { fileRoutes } from './routes/files.js';
import { triggerRoutes, webhookRoutes } from './routes/triggers.js';
import { TICK_CHECK_MS, TriggerTicker } from './triggers/ticker.js';
import { TickWatch } from './triggers/tick-watch.js';
import { openAiRoutes } from './openai/routes.js';
import { pruneGatewayUsage } from './gateway/accounting.js';
import { createGateways } from './gateway/index.js';
import { gatewayRoutes } from './gateway/routes.js';
import { RunEvents } from './runs/events.js';
import { Executor } from './runs/executor.js';
import { longestPeriodMs, tenantPolicy } from './runs/policy.js';
import { getRun, toApiRun } from './runs/store.js';
import { RunWaiters } from './runs/waiters.js';
import type { ServerSettings } from './settings.js';
import type { Store } from './store/store.js';
import { onRequestCheck } from './http/hooks.js';
import { appClock } from './clock.js';
import { tuning } from './tuning.js';
import { pruneEvents } from './streams/queries.js';
import { waitingCounts } from './runs/waiting-counts.js';
import { MAX_TIMER_MS } from './units.js';

export interface ServerApp {
  readonly fastify: FastifyInstance;
  readonly executor: Executor;
  readonly upkeep: NodeUpkeep;
  readonly waiters: RunWaiters;
  readonly callbacks: CallbackDispatcher;
  /** Places, revocations and the failed-auth limiter (memory or Redis). */
  readonly cache: CacheStore;
  /** Schedule triggers' ticks (run by the upkeep loop; `tickNow` for tests and tools). */
  readonly triggers: TriggerTicker;
  /** Slot and run counts, admission decisions and metrics (`/metrics`, `/dashboard`). */
  readonly ops: Ops;
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
  /**
   * Fastify's logger option (pino); default: JSON at info, or SLUICE_LOG_LEVEL. Options given
   * (a level, a stream) keep the redaction of ops/logging.ts; `false` turns logs off.
   */
  logger?: FastifyServerOptions['logger'];
  /** Vets callback destinations; default: public http(s) addresses only, unless SLUICE_CALLBACK_ALLOW_PRIVATE. */
  checkCallbackUrl?: RouteContext['checkCallbackUrl'];
  /** The cache store; default: the one `settings.cacheStore` names, opened here and closed with the app. */
  cache?: CacheStore;
  /** Epoch ms for schedule ticks and webhook timestamps; default: `clock`'s (tests pass a manual clock). */
  now?: () => number;
  /** The secret a scraper may send to `/metrics` besides an admin token; default: SLUICE_METRICS_TOKEN. */
  metricsToken?: string;
  ops?: OpsOptions;
  /** The clock of every component (admission, executor, upkeep, thread waits); default: the system clock. */
  clock?: RouteContext['clock'];
  /**
   * false: streams still number their events, but nothing is stored, so nothing can be resumed
   * or replayed (bench:stream measures what storing costs against it). @default true
   */
  storeRunEvents?: boolean;
}

/**
 * The HTTP app: plugins, routes, auth and the one error handler. Builds the executor and the
 * waiters but starts nothing in the background, so it can be tested with `fastify.inject`.
 */
export async function createApp(options: AppOptions): Promise<ServerApp> {
  const { store, config, settings } = options;
  const db = store.db;
  const fastify = Fastify({
    logger: appLogger(options.logger),
    genReqId: requestIdOf,
    bodyLimit: requestLimits.bodyBytes,
    // Receiving a whole request (headers and body) may take this long; a client that trickles
    // a body is cut off. Held responses are not bounded by it.
    requestTimeout: settings.requestTimeoutMs,
    // An idle socket is closed after this; a held call stays under it.
    connectionTimeout: Math.min(settings.syncTimeoutMs + tuning.heldSocketSlackMs, MAX_TIMER_MS),
    routerOptions: { maxParamLength: 500 },
    // request.ip: the socket's address, or that many proxies back in X-Forwarded-For.
    trustProxy:
      settings.trustProxyHops > 0 ? (_address: string, hop: number) => hop < settings.trustProxyHops : false,
    ajv: {
      customOptions: { removeAdditional: false, coerceTypes: false, useDefaults: false, allErrors: false },
    },
    ...protocolOptions,
    http: {
      ...protocolOptions.http,
      // Node enforces the request timeout only when it looks at its connections (every 30 s by
      // default): look often enough that a slow client is cut soon after its time is up.
      connectionsCheckingInterval: Math.min(5_000, Math.max(250, settings.requestTimeoutMs / 4)),
    },
  });
  fastify.server.maxConnections = settings.maxConnections;
  // Connections with no request in progress. Node's close() waits for a connection that has
  // not sent a request yet (a client's spare keep-alive socket, a silent one) until the client
  // leaves, and stops the checks that would time it out; close cuts these itself.
  const quiet = new Set<Socket>();
  fastify.server.on('connection', (socket: Socket) => {
    quiet.add(socket);
    socket.once('close', () => quiet.delete(socket));
  });
  fastify.server.on('request', (request: IncomingMessage, response: ServerResponse) => {
    quiet.delete(request.socket);
    response.once('close', () => {
      if (!request.socket.destroyed) quiet.add(request.socket);
    });
  });
  // An upgraded socket (a WebSocket) belongs to its session, which closes it in its own time.
  fastify.server.on('upgrade', (request: IncomingMessage) => quiet.delete(request.socket));
  fastify.server.headersTimeout = Math.min(10_000, settings.requestTimeoutMs);
  const log = (level: 'info' | 'warn' | 'error', message: string, fields: object = {}) =>
    (fastify.log as FastifyBaseLogger)[level](fields, message);
  installRequestId(fastify);
  installErrorHandling(fastify, log);
  // Before any hook that may refuse (a bad request, 503 while draining, 401, 429): an upgrade
  // request must be known as one, so the plugin ends its socket after whatever answer it gets.
  const sessions = new Set<SocketSession>();
  await installWebsocket(fastify, sessions);
  fastify.addHook('onRequest', onRequestCheck(checkUpgrade));
  installProtocolHandling(fastify);

  installJsonBody(fastify);

  let isDraining = false;
  // Registered before any route plugin, so every route inherits it, whatever its path spelling.
  fastify.addHook(
    'onRequest',
    onRequestCheck((request) => {
      if (isDraining && request.routeOptions.url !== '/readyz') throw draining();
    }),
  );

  await fastify.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: { title: 'Sluice run server', version: '1' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  });

  const cache = options.cache ?? (await openCacheStore(settings, log));
  const events = new RunEvents(db, (message, error) => log('warn', message, { error: String(error) }));
  const clock = appClock(options);
  const principals = new Principals(db, events, () => clock.now());
  const waiters = new RunWaiters(db, events);
  // Polls standing in for other processes' work: far apart where no other process writes.
  const fallbackPolls = store.solo ? tuning.soloPollFactor : 1;
  const executor = new Executor(db, config, settings, waiters, events, log, clock, {
    storeEvents: options.storeRunEvents ?? true,
    idlePollMs: tuning.idlePollMs * fallbackPolls,
  });
  const limitsFor = tenantPolicy(config, settings);
  const providerWaiting = (tenant: string, agent: string) => {
    const limiter = (agentFor(config, tenant, agent) as { limiter?: { name: string } } | undefined)?.limiter;
    return limiter !== undefined && ops.slots.waiting(limiter.name);
  };
  const ops: Ops = new Ops(db, config, executor, {
    clock,
    waiting: (tenant) =>
      waitingCounts(db, {
        tenant,
        limitsFor,
        deferredRunningCap: settings.deferredMaxRunningPerTenant,
        providerWaiting,
      }),
    ...options.ops,
  });
  const upkeep = new NodeUpkeep(db, executor, settings, limitsFor, log, clock, {
    promoteIdleMs: tuning.promoteIdleMs * fallbackPolls,
  });
  const gateways = createGateways({ config, db, cache, limitsFor, ops, clock, log });
  // Every final state with a callback_url leaves a row in the outbox (a trigger writes it in the
  // same transaction); this process's dispatcher delivers rows of any process, signed.
  const callbacks = new CallbackDispatcher({
    db,
    pollIntervalMs: dispatcherDefaults.pollIntervalMs * fallbackPolls,
    allowPrivate: settings.callbackAllowPrivate,
    renderRun: async (id, tenant) => {
      const run = await getRun(db, tenant, id);
      return run && toApiRun(run);
    },
    log: (event) => {
      if (event.type === 'error' || event.type === 'dead' || event.type === 'failed')
        log('warn', `callback ${event.type}`, event);
    },
  });
  // The outbox trigger tells every process when it queued a delivery (031_callback_notify.sql).
  events.on((event) => {
    if (event.kind === 'callback') callbacks.notify();
  });
  const triggerTicks = new TickWatch(store.solo === true);
  const ctx: RouteContext = {
    triggerTicks,
    principals,
    db,
    config,
    settings,
    executor,
    waiters,
    places: cache,
    limitsFor,
    clock,
    checkCallbackUrl:
      options.checkCallbackUrl ??
      (async (raw) => {
        const checked = await checkCallbackUrl(raw, { allowPrivate: settings.callbackAllowPrivate });
        return checked.ok ? checked : { ok: false, message: checked.message };
      }),
    isDraining: () => isDraining,
    admissions: ops.admissions,
    providerWaiting: (tenant, agent) => {
      const limiter = (agentFor(config, tenant, agent) as { limiter?: { name: string } } | undefined)
        ?.limiter;
      return limiter !== undefined && ops.slots.waiting(limiter.name);
    },
  };

  const now = options.now ?? (() => clock.now());
  const triggers = new TriggerTicker(ctx, now, log, triggerTicks);
  upkeep.addJob('triggers', TICK_CHECK_MS, () => triggers.check());
  upkeep.addJob('stream-events', tuning.pruneStreamsEveryMs, () =>
    pruneEvents(db, settings.streamRetentionMs, tuning.upkeepBatch),
  );
  upkeep.addJob('gateway-usage', tuning.pruneGatewayUsageEveryMs, () =>
    pruneGatewayUsage(db, longestPeriodMs, tuning.upkeepBatch),
  );

  opsRoutes(fastify, { store, isDraining: () => isDraining, isBeating: () => upkeep.beating() });
  // Webhooks carry a signature, not a bearer token: outside the authenticated scope.
  await fastify.register(webhookRoutes(ctx, now, cache), { prefix: '/api/client/v1' });
  metricsRoutes(fastify, {
    principals,
    cache,
    ops,
    metricsToken: options.metricsToken ?? metricsTokenOf(process.env),
  });
  await fastify.register(async (api) => wsRoutes(api, ctx, sessions, log, cache), {
    prefix: '/api/client/v1',
  });
  await fastify.register(
    gatewayRoutes(gateways, {
      principals,
      cache,
      tenants: config.tenants,
      onError: (request, error) =>
        log('error', 'gateway request failed', { reqId: request.id, error: (error as Error)?.stack }),
    }),
    { prefix: '/api/client/v1' },
  );
  await fastify.register(
    async (api) => {
      api.addHook('onRequest', authenticate(principals, cache));
      runRoutes(api, ctx);
      threadRoutes(api, ctx);
      openAiRoutes(api, ctx);
      triggerRoutes(api, ctx);
      agUiRoutes(api, ctx);
      await api.register(async (files) => fileRoutes(files, ctx));
    },
    { prefix: '/api/client/v1' },
  );

  let started = false;
  let ended: Promise<string[]> | undefined;
  const finish = async (drainMs: number) => {
    isDraining = true;
    waiters.closeAll();
    const stopping = executor.stopWorkers();
    // Open gateway requests get the same drain time as runs, then are cut.
    const [left] = await Promise.all([executor.settle(drainMs), gateways.settle(drainMs)]);
    let interruptedIds: string[] = [];
    if (left.length > 0) {
      interruptedIds = await interruptRuns(db, executor.node, left).catch(() => []);
      await executor.stopAll('interrupted');
    }
    await stopping;
    await executor.close();
    // Connections that go idle after their last answer are closed as they do, instead of
    // waiting out the keep-alive time; those that never sent a request are closed now.
    const idle = setInterval(() => fastify.server.closeIdleConnections(), 100);
    const closing = fastify.close().finally(() => clearInterval(idle));
    for (const socket of quiet) socket.destroy();
    await closing;
    gateways.close();
    await callbacks.stop();
    ops.close();
    upkeep.stop();
    await events.stop();
    if (!options.cache) await cache.close().catch(() => undefined);
    if (started) await leave(db, executor.node).catch(() => undefined);
    return interruptedIds;
  };
  return {
    fastify,
    executor,
    upkeep,
    waiters,
    callbacks,
    cache,
    triggers,
    ops,
    async start() {
      await upkeep.start();
      started = true;
      await events.start();
      executor.startWorkers(() => upkeep.beating());
      callbacks.start();
    },
    drain() {
      return (ended ??= finish(settings.drainTimeoutMs));
    },
    async close() {
      await (ended ??= finish(0));
    },
  };
}
