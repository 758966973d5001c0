import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Database } from '@sluice/postgres/database';
import type { Agent } from 'sluice';
import { createAgent } from 'sluice';
import {
  createApp,
  createToken,
  defineConfig,
  openStore,
  resolveSettings,
  serve,
  type RunningServer,
  type ServerApp,
  type ServerSettings,
  type SluiceConfig,
} from '@sluice/server';
import type { ProviderStandIn } from '@sluice/testkit';
import { afterThisTest, startStandIn, type Body, type Reply } from '../helpers.js';

/** What the limits tests need beyond the shared harness: their own agents, and a store they can watch. */

type Who = Partial<{ tenant: string; project: string; user: string; role: 'admin' | 'member' | 'read' }>;

/** The model of every agent here: the stand-in, priced at $1 per million tokens each way. */
export function standInModel(provider: ProviderStandIn) {
  return {
    api: 'openai-completions' as const,
    provider: 'stand-in',
    id: 'm',
    baseUrl: provider.url,
    cost: { input: 1, output: 1 },
  };
}

/** Requests to a server's API, as the token given. */
export function apiClient(url: string) {
  return async (method: string, path: string, token: string, body?: unknown): Promise<Reply> => {
    const r = await fetch(`${url}/api/client/v1${path}`, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
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
}

export interface AgentServer {
  server: RunningServer;
  provider: ProviderStandIn;
  token(who?: Who): Promise<string>;
  call: ReturnType<typeof apiClient>;
}

/** A server on embedded PGlite with the agents given (built on the stand-in's model), closed after the test. */
export async function startAgentServer(options: {
  agents: (model: ReturnType<typeof standInModel>) => Record<string, Agent<string> | Agent<never>>;
  provider?: ProviderStandIn;
  tenants?: SluiceConfig['tenants'];
  settings?: Partial<ServerSettings>;
}): Promise<AgentServer> {
  const provider = options.provider ?? (await startStandIn());
  const dir = mkdtempSync(join(tmpdir(), 'sluice-limits-'));
  const server = await serve({
    config: defineConfig({
      agents: options.agents(standInModel(provider)),
      tenants: options.tenants,
      settings: options.settings,
    }),
    port: 0,
    dataDir: dir,
    databaseUrl: '',
    logger: false,
  });
  afterThisTest(async () => {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const token = async (who: Who = {}) =>
    (
      await createToken(server.store.db, {
        tenant: who.tenant ?? 't',
        project: who.project ?? 'p',
        user: who.user ?? 'u',
        role: who.role ?? 'member',
      })
    ).secret;
  return { server, provider, token, call: apiClient(server.url) };
}

/** Statements a database handle was asked to run, counted as they start. */
export interface QueryCounts {
  queries: number;
  transactions: number;
  /** Sees each `query` (not those inside transactions) as it starts. */
  onQuery?: (text: string, params: unknown[] | undefined) => void;
}

/** The same database, counting every `query` and `transaction` that goes through it. */
export function countingDatabase(db: Database, counts: QueryCounts): Database {
  return {
    query: (text, params) => {
      counts.queries++;
      counts.onQuery?.(text, params);
      return db.query(text, params);
    },
    transaction: (body, options) => {
      counts.transactions++;
      return db.transaction(body, options);
    },
    ...(db.listen ? { listen: db.listen.bind(db) } : {}),
  };
}

/**
 * An app built with `createApp` over an embedded store whose every statement is counted,
 * listening on a free port and started; closed after the test.
 */
export async function startCountedApp(settings: Partial<ServerSettings>): Promise<{
  app: ServerApp;
  url: string;
  counts: QueryCounts;
  provider: ProviderStandIn;
  token(who?: Who): Promise<string>;
}> {
  const provider = await startStandIn();
  const dir = mkdtempSync(join(tmpdir(), 'sluice-counted-'));
  const store = await openStore({ dataDir: join(dir, 'db') });
  const counts: QueryCounts = { queries: 0, transactions: 0 };
  const app = await createApp({
    store: { ...store, db: countingDatabase(store.db, counts) },
    config: defineConfig({
      agents: { echo: createAgent({ model: standInModel(provider), credentials: { apiKey: 'k' } }) },
    }),
    settings: resolveSettings(settings, {}),
    logger: false,
  });
  const url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
  await app.start();
  afterThisTest(async () => {
    await app.close();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const token = async (who: Who = {}) =>
    (
      await createToken(store.db, {
        tenant: who.tenant ?? 't',
        project: who.project ?? 'p',
        user: who.user ?? 'u',
        role: who.role ?? 'member',
      })
    ).secret;
  return { app, url, counts, provider, token };
}
