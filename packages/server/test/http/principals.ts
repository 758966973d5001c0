import type { OutgoingHttpHeaders } from 'node:http';
import { afterAll, beforeAll } from 'vitest';
import { createAgent } from 'sluice';
import {
  createToken,
  defineConfig,
  type ServerApp,
  type ServerSettings,
  type SluiceConfig,
  type Store,
} from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { startTestServer } from '../helpers.js';

/**
 * The principals every harness has. `acme` is limited to the `analyst` agent by the config's
 * per-tenant allowlist; the others may run every agent.
 */
export const principals = {
  admin: { tenant: 't', project: 'p', user: 'ann', role: 'admin' },
  member: { tenant: 't', project: 'p', user: 'meg', role: 'member' },
  reader: { tenant: 't', project: 'p', user: 'rob', role: 'read' },
  otherTenant: { tenant: 'globex', project: 'p', user: 'gus', role: 'member' },
  acme: { tenant: 'acme', project: 'p', user: 'amy', role: 'member' },
} as const;
export type TokenName = keyof typeof principals;

/**
 * Two agents against the provider stand-in (it answers `echo <last user message>` at once):
 * `echo` for everyone, `analyst` also for acme.
 */
export async function harnessConfig(settings: Partial<ServerSettings> = {}): Promise<{
  config: SluiceConfig;
  provider: ProviderStandIn;
}> {
  const provider = await startProviderStandIn({
    reply: (r) => {
      const last = [...r.messages].reverse().find((m) => m.role === 'user')?.content;
      return { text: `echo ${typeof last === 'string' ? last.slice(0, 100) : 'blocks'}` };
    },
  });
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const config = defineConfig({
    agents: {
      echo: createAgent({ model, credentials: { apiKey: 'k' } }),
      analyst: createAgent({ model, credentials: { apiKey: 'k' } }),
    },
    tenants: { acme: { agents: ['analyst'] } },
    settings,
    close: () => provider.close(),
  });
  return { config, provider };
}

/** Mints one token per principal; secrets by name. */
export async function mintTokens(store: Store): Promise<Record<TokenName, string>> {
  const tokens = {} as Record<TokenName, string>;
  for (const [name, who] of Object.entries(principals) as [TokenName, (typeof principals)[TokenName]][]) {
    tokens[name] = (await createToken(store.db, who)).secret;
  }
  return tokens;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- bodies are checked field by field
export type Body = Record<string, any>;

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | number | undefined>;
  /** The parsed JSON body, or undefined when the body was empty or not JSON. */
  body: Body | undefined;
  text: string;
}

export interface CallOptions {
  /** Whose bearer token to send; null: no Authorization header. @default 'admin' */
  token?: TokenName | null;
  /** Sent as JSON with `content-type: application/json`. */
  body?: unknown;
  /** Sent as is, as `application/json` unless `headers` say otherwise. */
  raw?: string | Buffer;
  headers?: OutgoingHttpHeaders;
}

export interface InjectHarness {
  readonly app: ServerApp;
  readonly store: Store;
  readonly tokens: Readonly<Record<TokenName, string>>;
  /** A request through the harness's client over `fastify.inject` (no socket); paths are given in full. */
  call(method: string, path: string, options?: CallOptions): Promise<Answer>;
  close(): Promise<void>;
}

/**
 * An app on a copy of the migrated PGlite template, reached through `fastify.inject` (no
 * socket), with no background work started (no workers, no sweeps): inline runs still execute
 * in the request. Closed after the test (or the file, from `beforeAll`), or by `close`.
 */
export async function startInjectHarness(settings: Partial<ServerSettings> = {}): Promise<InjectHarness> {
  const { config, provider } = await harnessConfig(settings);
  const started = await startTestServer({ config, provider, transport: 'inject', background: false });
  const { server } = started;
  const app: ServerApp = server;
  const store = server.store;
  const tokens = await mintTokens(store);
  return {
    app,
    store,
    tokens,
    // The harness's one client, its `Reply` read as an `Answer`.
    async call(method, path, options = {}) {
      const token = options.token === undefined ? 'admin' : options.token;
      const reply = await started.call(method, path, options.body, token ? tokens[token] : null, {
        raw: options.raw,
        headers: headerStrings(options.headers),
        fullPath: true,
        anyBody: true,
      });
      return {
        status: reply.status,
        headers: Object.fromEntries(reply.headers),
        body: jsonOrUndefined(reply.text ?? ''),
        text: reply.text ?? '',
      };
    },
    close: () => server.close(),
  };
}

function headerStrings(headers: OutgoingHttpHeaders = {}): Record<string, string> {
  const strings: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) strings[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return strings;
}

/** The body parsed as JSON, or undefined when it is empty or not JSON. */
function jsonOrUndefined(text: string): Body | undefined {
  try {
    return text === '' ? undefined : (JSON.parse(text) as Body);
  } catch {
    return undefined;
  }
}

/**
 * A harness for the test file that calls it: started before its first test, closed after its
 * last. The returned object is usable inside tests and hooks.
 */
export function useInjectHarness(settings: Partial<ServerSettings> = {}): InjectHarness {
  let harness: InjectHarness | undefined;
  const get = () => {
    if (!harness) throw new Error('the inject harness is used before beforeAll started it');
    return harness;
  };
  // Generous: PGlite's start (WebAssembly, migrations) is slow on a loaded machine.
  beforeAll(async () => {
    harness = await startInjectHarness(settings);
  }, 180_000);
  afterAll(async () => {
    await harness?.close();
  }, 60_000);
  return {
    get app() {
      return get().app;
    },
    get store() {
      return get().store;
    },
    get tokens() {
      return get().tokens;
    },
    call: (method, path, options) => get().call(method, path, options),
    close: () => get().close(),
  };
}

/** The one error body shape: `{ error: { type, code, message, param } }`, code repeating type. */
export function errorShapeProblem(body: unknown): string | undefined {
  const error = (body as { error?: Record<string, unknown> } | undefined)?.error;
  if (!error || typeof error !== 'object') return `no error object in ${JSON.stringify(body)?.slice(0, 200)}`;
  if (typeof error.type !== 'string' || error.type === '') return 'error.type is not a string';
  if (error.code !== error.type) return `error.code ${String(error.code)} is not error.type ${error.type}`;
  if (typeof error.message !== 'string' || error.message === '') return 'error.message is not a string';
  if (!('param' in error) || (error.param !== null && typeof error.param !== 'string'))
    return 'error.param is neither a string nor null';
  return undefined;
}
