import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { SluiceConfig } from './config.js';
import { loadConfig, serve, type RunningServer } from './server.js';
import { tuneHeap } from './heap-tuning.js';
import { tenantSigningSecret } from './callbacks/index.js';
import { RedisCacheStore } from './cache/redis.js';
import { startTracing, type Tracing } from './ops/tracing.js';
import { openStore } from './store/store.js';
import { countTokens, createToken, listTokens, revokeToken, type Role } from './store/tokens.js';

const usage = `Usage:
  sluice serve [--config FILE] [--port N] [--host H]
  sluice tokens create --tenant T --project P --user U --role admin|member|read
  sluice tokens list [--tenant T]
  sluice tokens revoke ID
  sluice webhooks secret --tenant T`;

/** The store the CLI's token commands use: DATABASE_URL, else the embedded one in ./.sluice. */
const openCliStore = () =>
  openStore({ databaseUrl: process.env.DATABASE_URL || undefined, dataDir: resolve('.sluice', 'db') });

async function serveCommand(args: string[]): Promise<void> {
  // First: the flag must be set before a burst has made V8 pretenure anything (heap-tuning.ts).
  tuneHeap();
  // Signals are taken first: a SIGTERM during a slow start (a config that starts things, a
  // database not up yet) stops the process cleanly instead of being lost or killing it
  // half-open. The handlers stay registered, and a second signal while draining changes nothing.
  const state: { server?: RunningServer; signal?: string; stopping?: Promise<void>; tracing?: Tracing } = {};
  // Aborted by a signal before the server is up: start-up gives up and closes what it opened.
  const starting = new AbortController();
  const stop = (signal: string) => {
    state.signal ??= signal;
    const server = state.server;
    if (!server) return starting.abort(new Error(`${signal} during start-up`));
    if (state.stopping) return;
    state.stopping = (async () => {
      console.log(`${signal}: draining`);
      const interrupted = await server.drain();
      if (interrupted.length > 0)
        console.log(`Interrupted ${interrupted.length} runs that did not finish in time`);
      // The spans of the last runs are still batched: send them before the process ends.
      await state.tracing?.shutdown().catch((error: unknown) => console.error('trace export failed:', error));
      process.exit(0);
    })();
  };
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => stop(signal));
  // Nothing that slips through a handler ends the process with runs in flight: it is logged.
  process.on('unhandledRejection', (reason) => console.error('unhandled rejection:', reason));

  const { values } = parseArgs({
    args,
    options: { config: { type: 'string' }, port: { type: 'string' }, host: { type: 'string' } },
  });
  const port = values.port === undefined ? 8787 : Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`Expected --port to be 0 to 65535, got ${values.port}`);
  // A config module cannot be told to stop loading; nothing of the server is open yet then, so
  // a signal meanwhile ends the process without waiting for it.
  const aborted = new Promise<never>((_, reject) =>
    starting.signal.addEventListener('abort', () => reject(starting.signal.reason as Error), { once: true }),
  );
  aborted.catch(() => undefined);
  let loaded: { config: SluiceConfig; source: string };
  let server: RunningServer;
  try {
    // Before the config loads, so spans of anything it starts are exported too; only with an
    // OTLP endpoint set, else nothing of the SDK is loaded.
    state.tracing = await startTracing();
    loaded = await Promise.race([loadConfig(values.config), aborted]);
    server = await serve({ config: loaded.config, port, host: values.host, signal: starting.signal });
  } catch (error) {
    if (!starting.signal.aborted) throw error;
    console.log(`${state.signal}: stopped before serving`);
    process.exit(0);
  }
  // A first admin token, only for a store that has none: restarts mint nothing new. Made before
  // the server counts as up, so that a signal meanwhile waits for it instead of closing the
  // store under it.
  const token = await firstToken(server).catch(async (error: unknown) => {
    await server.close();
    throw error;
  });
  const { config, source } = loaded;
  state.server = server;
  if (state.signal) return stop(state.signal);
  const agents = Object.keys(config.agents);
  console.log(`Sluice is serving ${agents.join(', ')} (${source}) on ${server.url}`);
  console.log(
    process.env.DATABASE_URL
      ? 'State: PostgreSQL (DATABASE_URL)'
      : `State: embedded PGlite in ${resolve('.sluice')}`,
  );
  if (token) {
    console.log(
      `\nA first admin token was created (shown once; more with \`sluice tokens create\`).\nTry it:\n  curl -s ${server.url}/api/client/v1/agents/${agents[0]}/runs \\\n    -H "Authorization: Bearer ${token}" -H "Content-Type: application/json" \\\n    -d '{"input": "tides"}'\n`,
    );
  }
}

async function firstToken(server: RunningServer): Promise<string | undefined> {
  if ((await countTokens(server.store.db)) > 0) return undefined;
  const token = await createToken(server.store.db, {
    tenant: 'local',
    project: 'default',
    user: 'local',
    role: 'admin',
  });
  return token.secret;
}

async function tokensCommand(sub: string | undefined, args: string[]): Promise<void> {
  if (sub === 'create') {
    const { values } = parseArgs({
      args,
      options: {
        tenant: { type: 'string' },
        project: { type: 'string' },
        user: { type: 'string' },
        role: { type: 'string' },
        config: { type: 'string' },
      },
    });
    for (const field of ['tenant', 'project', 'user', 'role'] as const) {
      if (!values[field]) throw new Error(`Missing --${field}\n${usage}`);
    }
    const store = await openCliStore();
    try {
      const token = await createToken(store.db, {
        tenant: values.tenant!,
        project: values.project!,
        user: values.user!,
        role: values.role as Role,
      });
      console.log(
        `Token ${token.id} for tenant ${values.tenant}, project ${values.project}, user ${values.user}, role ${values.role}.`,
      );
      console.log('The secret is shown once:');
      console.log(token.secret);
    } finally {
      await store.close();
    }
    return;
  }
  if (sub === 'list') {
    const { values } = parseArgs({ args, options: { tenant: { type: 'string' } } });
    const store = await openCliStore();
    try {
      const tokens = await listTokens(store.db, values.tenant);
      if (tokens.length === 0) console.log('No tokens.');
      for (const t of tokens) {
        console.log(
          `${t.id}  tenant=${t.tenant} project=${t.project} user=${t.user} role=${t.role} created=${t.created_at}` +
            (t.revoked_at ? ` revoked=${t.revoked_at}` : ''),
        );
      }
    } finally {
      await store.close();
    }
    return;
  }
  if (sub === 'revoke') {
    const id = args[0];
    if (!id) throw new Error(`Missing the token id\n${usage}`);
    const store = await openCliStore();
    try {
      if (!(await revokeToken(store.db, id))) throw new Error(`No live token ${id}`);
      console.log(`Revoked ${id}: it is refused from its next request on.`);
      // Every request reads the token from the database, so the row above is what refuses it.
      // The Redis store also gets the revocation, for holders of connections authenticated
      // once (WebSockets) in every process.
      if (process.env.SLUICE_CACHE_STORE === 'redis' && process.env.REDIS_URL) {
        const cache = await RedisCacheStore.open({ url: process.env.REDIS_URL });
        try {
          await cache.revoke(id);
        } finally {
          await cache.close();
        }
      }
    } finally {
      await store.close();
    }
    return;
  }
  throw new Error(usage);
}

/** The tenant's callback signing secret (made on first use): what its receivers verify with. */
async function webhooksCommand(sub: string | undefined, args: string[]): Promise<void> {
  if (sub !== 'secret') throw new Error(usage);
  const { values } = parseArgs({ args, options: { tenant: { type: 'string' } } });
  if (!values.tenant) throw new Error(`Missing --tenant\n${usage}`);
  const store = await openCliStore();
  try {
    console.log(await tenantSigningSecret(store.db, values.tenant));
  } finally {
    await store.close();
  }
}

async function main(argv: string[]): Promise<void> {
  const [command, sub] = argv;
  if (command === 'webhooks') return webhooksCommand(sub, argv.slice(2));
  if (command === 'serve') return serveCommand(argv.slice(1));
  if (command === 'tokens') return tokensCommand(sub, argv.slice(2));
  console.log(usage);
  process.exitCode = command === undefined || command === 'help' || command === '--help' ? 0 : 1;
}

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : String(error));
  process.exit(1);
});
