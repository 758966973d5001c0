import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve, type RunningServer, type ServerSettings } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function start(settings: Partial<ServerSettings>) {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-deferred-'));
  const provider: ProviderStandIn = await startProviderStandIn({
    reply: (r) => {
      const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
      return last.includes('stall') ? { stall: true } : { text: `done ${last}` };
    },
  });
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const server: RunningServer = await serve({
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
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(`${server.url}/api/client/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    return {
      status: r.status,
      retryAfter: r.headers.get('retry-after'),
      // eslint-disable-next-line @typescript-eslint/no-explicit-any -- bodies are checked field by field
      body: (await r.json()) as Record<string, any>,
    };
  };
  const queue = async () => (await call('GET', '/agents/runs/queue')).body.deferred as Record<string, number>;
  return { server, call, queue };
}

async function until(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('condition not reached');
}

it('deferred runs: their own running cap per tenant, their own queue cap, and no effect on default-class runs', async () => {
  const { call, queue } = await start({
    deferredMaxRunningPerTenant: 2,
    deferredMaxQueuedPerTenant: 3,
    deferredConcurrency: 4,
    syncTimeoutMs: 300,
  });
  for (const n of [1, 2, 3]) {
    expect(
      (await call('POST', '/agents/echo/runs', { input: `stall d${n}`, class: 'deferred', wait: false }))
        .status,
    ).toBe(202);
  }
  // Four deferred workers, but the tenant may run only two deferred runs at once.
  await until(async () => (await queue()).running === 2 && (await queue()).queued === 1);
  await call('POST', '/agents/echo/runs', { input: 'stall d4', class: 'deferred', wait: false });
  await call('POST', '/agents/echo/runs', { input: 'stall d5', class: 'deferred', wait: false });
  const refused = await call('POST', '/agents/echo/runs', {
    input: 'stall d6',
    class: 'deferred',
    wait: false,
  });
  expect(refused.status).toBe(429);
  expect(refused.retryAfter).toBe('30');
  expect(refused.body.error).toMatchObject({
    type: 'agent_run_concurrency_limit',
    class: 'deferred',
    limit_value: 3,
  });
  expect(await queue()).toMatchObject({ running: 2, queued: 3, running_limit: 2, queued_limit: 3 });

  // Interactive work is not held up by the deferred backlog.
  const interactive = await call('POST', '/agents/echo/runs', { input: 'hello' });
  expect(interactive.status).toBe(200);
  expect(interactive.body.output).toEqual({ text: 'done hello' });

  // A caller that waits on a deferred run is not answered inline: 202 after the window.
  await call(
    'POST',
    `/agents/runs/${(await call('GET', '/agents/runs?status=queued&class=deferred')).body.data[0].id}/cancel`,
  );
  const waited = await call('POST', '/agents/echo/runs', { input: 'patient', class: 'deferred' });
  expect(waited.status).toBe(202);
  expect(waited.body.status).toBe('queued');
});

it('a deferred run not started within AGENT_DEFERRED_MAX_WAIT_MS fails expired', async () => {
  const { call } = await start({ deferredMaxRunningPerTenant: 1, deferredMaxWaitMs: 200, nodeStaleMs: 400 });
  await call('POST', '/agents/echo/runs', { input: 'stall first', class: 'deferred', wait: false });
  const second = await call('POST', '/agents/echo/runs', { input: 'second', class: 'deferred', wait: false });
  await until(async () => (await call('GET', `/agents/runs/${second.body.id}`)).body.status === 'failed');
  const run = await call('GET', `/agents/runs/${second.body.id}`);
  expect(run.body.error).toMatchObject({ type: 'expired' });
  expect(run.body.started_at).toBeNull();
});
