import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterEach, inject } from 'vitest';
import { createAgent } from 'sluice';
import {
  createToken,
  defineConfig,
  serve,
  type RunningServer,
  type RunsConfig,
  type ServerSettings,
  type SluiceConfig,
} from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { urlOf } from '../../../scripts/postgres-config.js';

/** Connection settings of this run's PostgreSQL (see scripts/vitest-global-setup.ts); undefined without one. */
export const postgres = inject('postgres');

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
/** Runs `cleanup` after the current test, last registered first. */
export const afterThisTest = (cleanup: () => Promise<void>) => void cleanups.push(cleanup);

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- response bodies are checked field by field
export type Body = Record<string, any>;
export interface Reply {
  status: number;
  retryAfter: string | null;
  headers: Headers;
  body: Body;
}

/** The last user message of a stand-in request. */
export const lastUserText = (r: { messages: readonly { role: string; content?: unknown }[] }) =>
  String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');

export interface TestServerOptions {
  settings?: Partial<ServerSettings>;
  tenants?: SluiceConfig['tenants'];
  /** A PostgreSQL database (see `freshDatabase`); default: embedded PGlite in a temp folder. */
  databaseUrl?: string;
  /** Stand-in answers; default: "stall" in the prompt hangs, "fail" is a provider 400, else "done <prompt>". */
  provider?: ProviderStandIn;
  /** The config's `runs` block. */
  runs?: RunsConfig;
  /** More agents beside `echo`, made for the stand-in's model (see `standInModel`). */
  agents?: (model: ReturnType<typeof standInModel>) => SluiceConfig['agents'];
}

/** The stand-in as a model for `createAgent`, priced so usage has a cost. */
export const standInModel = (provider: ProviderStandIn) => ({
  api: 'openai-completions' as const,
  provider: 'stand-in',
  id: 'm',
  baseUrl: provider.url,
  cost: { input: 0.001, output: 0.001 },
});

export interface TestServer {
  server: RunningServer;
  provider: ProviderStandIn;
  /** A token of tenant `t`, project `p` (admin unless given). */
  token(
    who?: Partial<{ tenant: string; project: string; user: string; role: 'admin' | 'member' | 'read' }>,
  ): Promise<string>;
  /** A request with the default admin token, or `token`. */
  call(method: string, path: string, body?: unknown, token?: string): Promise<Reply>;
  statusOf(id: string): Promise<Body>;
  /** The default admin token. */
  admin: string;
}

/** Tokens of a server's store and requests to its API: the admin token unless another is given. */
export async function apiClientOf(
  server: RunningServer,
): Promise<Pick<TestServer, 'token' | 'admin' | 'call'>> {
  const token: TestServer['token'] = async (who = {}) =>
    (
      await createToken(server.store.db, {
        tenant: who.tenant ?? 't',
        project: who.project ?? 'p',
        user: who.user ?? 'u',
        role: who.role ?? 'admin',
      })
    ).secret;
  const admin = await token();
  const call: TestServer['call'] = async (method, path, body, as) => {
    const r = await fetch(`${server.url}/api/client/v1${path}`, {
      method,
      headers: {
        authorization: `Bearer ${as ?? admin}`,
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
      },
      body: body !== undefined ? JSON.stringify(body) : undefined,
    });
    return {
      status: r.status,
      retryAfter: r.headers.get('retry-after'),
      headers: r.headers,
      body: (await r.json()) as Body,
    };
  };
  return { token, admin, call };
}

export async function startStandIn(): Promise<ProviderStandIn> {
  const provider = await startProviderStandIn({
    reply: (r) => {
      const last = lastUserText(r);
      if (last.includes('stall')) return { stall: true };
      if (last.includes('fail')) return { status: 400, message: 'the model refused' };
      return { text: `done ${last}`, usage: { input: 10, output: 10 } };
    },
  });
  afterThisTest(() => provider.close());
  return provider;
}

/**
 * A server with one `echo` agent against the provider stand-in, on embedded PGlite in a
 * temporary folder (or the PostgreSQL database given), quiet logs. Closed after the test.
 */
export async function startTestServer(options: TestServerOptions = {}): Promise<TestServer> {
  const dir = options.databaseUrl
    ? mkdtempSync(join(tmpdir(), 'sluice-server-test-'))
    : await preparedDataDir();
  const provider = options.provider ?? (await startStandIn());
  const model = standInModel(provider);
  const server = await serve({
    config: defineConfig({
      agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }), ...options.agents?.(model) },
      tenants: options.tenants,
      settings: options.settings,
      runs: options.runs,
    }),
    port: 0,
    dataDir: dir,
    databaseUrl: options.databaseUrl ?? '',
    logger: false,
  });
  afterThisTest(async () => {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const { token, admin, call } = await apiClientOf(server);
  return {
    server,
    provider,
    token,
    call,
    statusOf: async (id) => (await call('GET', `/agents/runs/${id}`)).body,
    admin,
  };
}

/**
 * A temp folder holding an embedded database that is already created and migrated: a copy of
 * the one the test run's global setup made (see scripts/vitest-global-setup.ts), which opens in
 * a fraction of the seconds PGlite's initdb takes.
 */
export async function preparedDataDir(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-server-test-'));
  cpSync(inject('pgliteTemplate'), join(dir, 'db'), { recursive: true });
  return dir;
}

/** Polls `check` until it holds (bounded: about 20 s). */
export async function until(check: () => Promise<boolean> | boolean, what = 'condition'): Promise<void> {
  for (let i = 0; i < 800; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`${what} not reached`);
}

/** A new empty PostgreSQL database for this test (dropped after it); its connection string. */
export async function freshDatabase(): Promise<string> {
  if (!postgres) throw new Error('PostgreSQL is not available');
  const name = `sluice_t_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e9).toString(36)}`;
  const admin = new pg.Client({ ...postgres });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  afterThisTest(async () => {
    const client = new pg.Client({ ...postgres });
    await client.connect();
    // The test's pools have ended, but pg's end() resolves before their sockets close: FORCE
    // would terminate those still closing, and each would report it as a pool 'error'. Give
    // them a moment to go first (a session still there after it is terminated).
    for (let i = 0; i < 80; i++) {
      const { rows } = await client.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1',
        [name],
      );
      if (rows[0]!.n === 0) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await client.end();
  });
  return urlOf(postgres, name);
}

/** A TCP proxy on 127.0.0.1 (see `startDatabaseProxy`). */
export interface TcpProxy {
  port: number;
  /** Connections refused (closed at once) while cut. */
  readonly refused: number;
  cut(): void;
  restore(): void;
  stall(): void;
  close(): Promise<void>;
}

/**
 * A TCP proxy on 127.0.0.1 in front of this run's PostgreSQL: `cut()` ends every connection
 * through it and refuses new ones (what a database restart looks like from the server),
 * `restore()` lets connections through again. `stall()` stops forwarding on the connections
 * open now without closing them (a NAT that forgot them, a partition with no reset); new
 * connections still go through.
 */
export async function startDatabaseProxy(): Promise<TcpProxy> {
  if (!postgres) throw new Error('PostgreSQL is not available');
  return startTcpProxy(
    postgres.host?.startsWith('/')
      ? { path: join(postgres.host, `.s.PGSQL.${postgres.port ?? 5432}`) }
      : { host: postgres.host ?? '127.0.0.1', port: postgres.port ?? 5432 },
  );
}

/** The same proxy in front of any `target` (a Redis, say). */
export async function startTcpProxy(target: net.NetConnectOpts): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>();
  const pairs = new Set<[net.Socket, net.Socket]>();
  let down = false;
  let refused = 0;
  const server = net.createServer((client) => {
    if (down) {
      refused++;
      return client.destroy();
    }
    const upstream = net.connect(target);
    sockets.add(client).add(upstream);
    const pair: [net.Socket, net.Socket] = [client, upstream];
    pairs.add(pair);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
      pairs.delete(pair);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  const proxy = {
    port,
    get refused() {
      return refused;
    },
    cut() {
      down = true;
      for (const s of sockets) s.destroy();
      sockets.clear();
    },
    restore() {
      down = false;
    },
    stall() {
      // What either side sends from now on goes nowhere, and nothing closes.
      for (const [client, upstream] of pairs) {
        client.unpipe(upstream);
        upstream.unpipe(client);
        client.on('data', () => undefined);
        upstream.on('data', () => undefined);
      }
    },
    close: () =>
      new Promise<void>((resolve) => {
        proxy.cut();
        server.close(() => resolve());
      }),
  };
  afterThisTest(() => proxy.close());
  return proxy;
}

/** The database name of a `postgresql://` connection string. */
export function databaseNameOf(databaseUrl: string): string {
  return new URL(databaseUrl.replace(/^postgresql:\/\/[^/]*\//, 'http://x/')).pathname.slice(1);
}

/** The connection string of `databaseUrl`'s database, through a proxy on `port`. */
export function throughProxy(databaseUrl: string, port: number): string {
  const database = databaseNameOf(databaseUrl);
  return `postgresql://${encodeURIComponent(postgres?.user ?? 'root')}@127.0.0.1:${port}/${database}`;
}
