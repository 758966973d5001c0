import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createAgent } from 'sluice';
import {
  createApp,
  defineConfig,
  openStore,
  resolveSettings,
  serve,
  type RunningServer,
  type AppOptions,
  type RunsConfig,
  type ServerApp,
  type ServerSettings,
  type SluiceConfig,
  type Store,
  type WebsocketConfig,
} from '@sluice/server';
import type { ProviderStandIn } from '@sluice/testkit';
import { apiClientOf, type ApiClient, type Body } from './client.js';
import { freshDatabase, preparedDataDir, runsLeftRunning } from './database.js';
import { afterThisTest } from './registry.js';
import { standInModel, startStandIn, type Price } from './stand-in.js';

// The one way the server tests start a server: on a socket on 127.0.0.1 (what a client or a
// stream sees) or behind `fastify.inject` (no socket: validation, shapes, fuzz), on a copy of
// the migrated PGlite template or on a PostgreSQL database. It is closed after the test (or
// after the file, when started in `beforeAll`), and the leak guard checks it let go of its
// port, its runs and its timers.

export interface TestServerOptions {
  /** `socket`: listens on 127.0.0.1, port 0; `inject`: requests go through `fastify.inject`. @default 'socket' */
  transport?: 'socket' | 'inject';
  /** `pglite`: a copy of the migrated template; `postgres`: a new database of this run's PostgreSQL. @default 'pglite' */
  database?: 'pglite' | 'postgres';
  /** A PostgreSQL database to use instead (see `freshDatabase`), shared with another server, say. */
  databaseUrl?: string;
  settings?: Partial<ServerSettings>;
  tenants?: SluiceConfig['tenants'];
  /** Stand-in answers; default: "stall" in the prompt hangs, "fail" is a provider 400, else "done <prompt>". */
  provider?: ProviderStandIn;
  /** The config's `runs` block. */
  runs?: RunsConfig;
  /** The config's `websocket` block. */
  websocket?: WebsocketConfig;
  /** More agents beside `echo`, made for the stand-in's model (see `standInModel`). */
  agents?: (model: ReturnType<typeof standInModel>) => SluiceConfig['agents'];
  /** The `echo` agent; false: only `agents`. @default true */
  echo?: boolean;
  /** The stand-in model's price. @default $0.001 per million tokens each way */
  price?: Price;
  /** Wraps the store the app sees (to count its statements, say). */
  wrapStore?: (store: Store) => Store;
  /** The background work (workers, sweeps, notifications); false: none, inline runs still execute. @default true */
  background?: boolean;
  /** The clock of every component of the app (a `ManualClock`, say); default: the system clock. */
  clock?: AppOptions['clock'];
  /** Epoch ms for schedule ticks and webhook timestamps; default: the clock's. */
  now?: AppOptions['now'];
  /** The cache store the app uses instead of the one its settings name (not closed with the app). */
  cache?: AppOptions['cache'];
  /** The app's logger (a level and a stream to read its lines, say). @default false: no logs */
  logger?: AppOptions['logger'];
  /** A whole config instead of the one built from the options above (agents, tenants, settings...). */
  config?: SluiceConfig;
}

export interface TestServer extends ApiClient {
  /** The server; `url` is empty under `inject`. */
  server: RunningServer;
  provider: ProviderStandIn;
  /** The database's connection string; undefined on PGlite. */
  databaseUrl: string | undefined;
  statusOf(id: string): Promise<Body>;
}

/** A server with one `echo` agent (and `agents`) against the provider stand-in, closed after the test. */
export async function startTestServer(options: TestServerOptions = {}): Promise<TestServer> {
  const databaseUrl =
    options.databaseUrl ?? (options.database === 'postgres' ? await freshDatabase() : undefined);
  const dir = databaseUrl ? mkdtempSync(join(tmpdir(), 'sluice-server-test-')) : await preparedDataDir();
  const provider = options.provider ?? (await startStandIn());
  const model = standInModel(provider, options.price);
  const config =
    options.config ??
    defineConfig({
      agents: {
        ...(options.echo === false ? {} : { echo: createAgent({ model, credentials: { apiKey: 'k' } }) }),
        ...options.agents?.(model),
      },
      tenants: options.tenants,
      settings: options.settings,
      runs: options.runs,
      websocket: options.websocket,
    });
  const inject = options.transport === 'inject';
  let server: RunningServer;
  try {
    const parts = { clock: options.clock, now: options.now, cache: options.cache };
    server =
      inject || options.wrapStore || options.background === false || Object.values(parts).some(Boolean)
        ? await appServer(config, {
            dir,
            databaseUrl,
            listen: !inject,
            wrapStore: options.wrapStore,
            background: options.background ?? true,
            app: { ...parts, logger: options.logger },
          })
        : await serve({
            config,
            port: 0,
            dataDir: dir,
            databaseUrl: databaseUrl ?? '',
            logger: options.logger ?? false,
          });
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  ownServer(server, { databaseUrl, dir });
  const client = await apiClientOf(
    options.transport === 'inject' ? { store: server.store, app: server } : server,
  );
  return {
    ...client,
    server,
    provider,
    databaseUrl,
    statusOf: async (id) => (await client.call('GET', `/agents/runs/${id}`)).body,
  };
}

/**
 * What `serve` builds, from its parts: the store (wrapped if asked), the app, listening on
 * 127.0.0.1 or not at all (for `inject`), and its background work.
 */
async function appServer(
  config: SluiceConfig,
  options: {
    dir: string;
    databaseUrl?: string;
    listen: boolean;
    wrapStore?: (store: Store) => Store;
    background: boolean;
    /** What else `createApp` is given. */
    app?: Pick<AppOptions, 'clock' | 'now' | 'cache' | 'logger'>;
  },
): Promise<RunningServer> {
  const settings = resolveSettings(config.settings, process.env, config.runs, config.websocket);
  const store = await openStore({ databaseUrl: options.databaseUrl, dataDir: resolve(options.dir, 'db') });
  let app: ServerApp | undefined;
  let url = '';
  try {
    app = await createApp({
      ...options.app,
      store: options.wrapStore?.(store) ?? store,
      config,
      settings,
      logger: options.app?.logger ?? false,
    });
    if (options.listen) url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    if (options.background) await app.start();
  } catch (error) {
    await app?.close().catch(() => undefined);
    await store.close();
    await config.close?.();
    throw error;
  }
  const running = app;
  let ending: Promise<void> | undefined;
  const end = (how: () => Promise<unknown>) =>
    (ending ??= (async () => {
      await how();
      await store.close();
      await config.close?.();
    })());
  return {
    ...running,
    url,
    store,
    config,
    drain: async () => {
      let interrupted: string[] = [];
      await end(async () => (interrupted = await running.drain()));
      return interrupted;
    },
    close: () => end(() => running.close()),
  };
}

/**
 * Registers `server`'s close (and the removal of its data folder) after the test, and the
 * probe that checks it let go: not listening, no run executing, no caller waiting, and on
 * PostgreSQL no run of its own left `running` in the database.
 */
export function ownServer(
  server: ServerApp & { readonly url?: string },
  where: { databaseUrl?: string; dir?: string },
): void {
  const name = `the server${server.url ? ` at ${server.url}` : ' (inject)'}`;
  afterThisTest(
    async () => {
      await server.close();
      if (where.dir) rmSync(where.dir, { recursive: true, force: true });
    },
    name,
    () => serverLeftovers(server, where.databaseUrl),
  );
}

/** What of a server is still going: its port, the runs it executes, its waiting callers, its rows. */
export async function serverLeftovers(server: ServerApp, databaseUrl?: string): Promise<string[]> {
  const left: string[] = [];
  if (server.fastify.server.listening) left.push('still listening');
  if (server.executor.active > 0)
    left.push(`runs still executing: ${server.executor.executing().join(', ')}`);
  if (server.waiters.size > 0) left.push(`${server.waiters.size} caller(s) still waiting for a run`);
  if (databaseUrl) {
    const running = await runsLeftRunning(databaseUrl, server.executor.node);
    if (running.length > 0) left.push(`runs left running in the database: ${running.join(', ')}`);
  }
  return left;
}
