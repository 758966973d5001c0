import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createApp, type AppOptions, type ServerApp } from './app.js';
import { ConcurrencyConfigError, loadProviderCode } from 'sluice';
import { ConfigLoadError, type SluiceConfig } from './config.js';
import { perProcessWarning, settingsOfConfig } from './cache/open.js';
import { demoConfig } from './demo-config.js';
import { resolveSettings } from './settings.js';
import { openStore, type Store } from './store/store.js';

export interface ServeOptions {
  /** Config module; default: sluice.config.{ts,mjs,js} in the working directory, else the demo. */
  configFile?: string;
  config?: SluiceConfig;
  port?: number;
  host?: string;
  /** PostgreSQL; default: DATABASE_URL, else embedded PGlite in `dataDir`. */
  databaseUrl?: string;
  /** @default ./.sluice */
  dataDir?: string;
  logger?: AppOptions['logger'];
  checkCallbackUrl?: AppOptions['checkCallbackUrl'];
  storeRunEvents?: AppOptions['storeRunEvents'];
  /** Aborting it gives up the start: what was opened is closed, and `serve` rejects. */
  signal?: AbortSignal;
}

export interface RunningServer extends ServerApp {
  readonly url: string;
  readonly store: Store;
  readonly config: SluiceConfig;
}

/** Loads the config module a user points at, or finds one in the working directory. */
export async function loadConfig(file?: string): Promise<{ config: SluiceConfig; source: string }> {
  const candidates = file ? [file] : ['sluice.config.ts', 'sluice.config.mjs', 'sluice.config.js'];
  for (const candidate of candidates) {
    const path = resolve(candidate);
    if (!existsSync(path)) {
      if (file) throw new Error(`Config file ${file} not found`);
      continue;
    }
    const config = await importConfig(path).catch((error: unknown) => {
      throw configLoadError(candidate, error);
    });
    if (!config) throw new Error(`${candidate} has no default export`);
    return { config, source: candidate };
  }
  return { config: await demoConfig(), source: 'built-in demo' };
}

async function importConfig(path: string): Promise<SluiceConfig | undefined> {
  const module = (await import(pathToFileURL(path).href)) as {
    default?: SluiceConfig | (() => Promise<SluiceConfig>);
  };
  const exported = module.default;
  return typeof exported === 'function' ? await exported() : exported;
}

/**
 * A limiter the config builds with an option it cannot take (a `rate` figure, `adaptive`,
 * `maxConcurrent`...) throws while the module loads. The start fails with the file and the
 * limiter in front of the limiter's own message, which names the field, what it takes and
 * the value given; anything else is passed on as it came.
 */
function configLoadError(file: string, error: unknown): unknown {
  // By name too: a config may load its own copy of sluice, whose class is another object.
  const fromLimiter =
    error instanceof ConcurrencyConfigError ||
    (error instanceof Error && error.name === 'ConcurrencyConfigError' && 'limiter' in error);
  if (!fromLimiter) return error;
  const cause = error as ConcurrencyConfigError;
  return new ConfigLoadError(`${file}: limiter \`${cause.limiter}\`: ${cause.message}`, file, cause);
}

/**
 * Opens the store, builds the app, listens, and only then starts the background work (workers
 * claim nothing before the port is bound). Whatever fails on the way closes what was opened.
 */
export async function serve(options: ServeOptions = {}): Promise<RunningServer> {
  const config = options.config ?? (await loadConfig(options.configFile)).config;
  const settings = resolveSettings(settingsOfConfig(config), process.env, config.runs, config.websocket);
  const dataDir = resolve(options.dataDir ?? '.sluice');
  const databaseUrl = options.databaseUrl ?? process.env.DATABASE_URL;
  let app: ServerApp | undefined;
  const store = await openStore({
    databaseUrl: databaseUrl || undefined,
    dataDir: resolve(dataDir, 'db'),
    statementTimeoutMs: settings.statementTimeoutMs,
    poolSize: settings.poolSize,
    preparedStatements: settings.preparedStatements,
    // A connection the database ended; the pool replaces it. Logged, never fatal.
    // Before the app and its logger exist, a database not up yet is said on stderr, so a
    // start that keeps retrying is never silent.
    onError: (error) =>
      app
        ? app.fastify.log.warn({ error: error.message }, 'database connection lost')
        : console.warn(`Database not reachable yet (${error.message}); trying again`),
    onNotice: (message) => console.warn(`Database: ${message}`),
    signal: options.signal,
  });
  try {
    options.signal?.throwIfAborted();
    app = await createApp({
      store,
      config,
      settings,
      logger: options.logger,
      checkCallbackUrl: options.checkCallbackUrl,
      storeRunEvents: options.storeRunEvents,
    });
    // The provider code of the agents' models, loaded before the first run instead of by it.
    const providerCode = await loadProviderCode(Object.values(config.agents).map((agent) => agent.modelApi));
    for (const { api, error } of providerCode.failed)
      app.fastify.log.warn(
        { api, error: String(error) },
        "a model API's provider code did not load; its first request will fail with this error",
      );
    // A start aborted meanwhile binds no port.
    options.signal?.throwIfAborted();
    const perProcess = perProcessWarning(app.cache, Boolean(databaseUrl));
    if (perProcess) app.fastify.log.warn(perProcess);
    const address = await app.fastify.listen({
      port: options.port ?? 8787,
      host: options.host ?? '127.0.0.1',
    });
    options.signal?.throwIfAborted();
    await app.start();
    const running = app;
    // Drain and close end the same way once: a second call (a signal during a close, a test's
    // cleanup after a close) waits for the first instead of closing a closed store.
    let ending: Promise<string[]> | undefined;
    const end = (how: () => Promise<string[]>) =>
      (ending ??= (async () => {
        const interrupted = await how();
        await store.close();
        await config.close?.();
        return interrupted;
      })());
    return {
      ...running,
      url: address,
      store,
      config,
      drain: () => end(() => running.drain()),
      close: async () => {
        await end(async () => {
          await running.close();
          return [];
        });
      },
    };
  } catch (error) {
    await app?.close().catch(() => undefined);
    await store.close().catch(() => undefined);
    await config.close?.();
    throw error;
  }
}
