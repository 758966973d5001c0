import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach } from 'vitest';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve, type RunningServer, type ServerSettings } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- response bodies are checked field by field
type Body = Record<string, any>;

export interface TestServer {
  server: RunningServer;
  /** A request with an admin token of tenant `t`, project `p`. */
  call(
    method: string,
    path: string,
    body?: unknown,
  ): Promise<{ status: number; retryAfter: string | null; body: Body }>;
  statusOf(id: string): Promise<Body>;
}

/**
 * A server on embedded PGlite in a temporary folder, with one `echo` agent against the
 * provider stand-in: a prompt containing "stall" hangs, anything else is answered "done ...".
 * Closed after the test.
 */
export async function startTestServer(settings: Partial<ServerSettings> = {}): Promise<TestServer> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-server-test-'));
  const provider = await startProviderStandIn({
    reply: (r) => {
      const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
      return last.includes('stall') ? { stall: true } : { text: `done ${last}` };
    },
  });
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const server = await serve({
    config: defineConfig({
      agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) },
      settings,
    }),
    port: 0,
    dataDir: dir,
    databaseUrl: '',
  });
  cleanups.push(async () => {
    await server.close();
    await provider.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const token = (await createToken(server.store.db, { tenant: 't', project: 'p', user: 'u', role: 'admin' }))
    .secret;
  const call: TestServer['call'] = async (method, path, body) => {
    const r = await fetch(`${server.url}/api/client/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    return {
      status: r.status,
      retryAfter: r.headers.get('retry-after'),
      body: (await r.json()) as Record<string, never>,
    };
  };
  return { server, call, statusOf: async (id) => (await call('GET', `/agents/runs/${id}`)).body };
}

/** Polls `check` until it holds (bounded). */
export async function until(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('condition not reached');
}
