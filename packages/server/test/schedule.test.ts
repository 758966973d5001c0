import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve, type ServerSettings } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function start(settings: Partial<ServerSettings>) {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-schedule-'));
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
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(`${server.url}/api/client/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- bodies are checked field by field
    return { status: r.status, body: (await r.json()) as Record<string, any> };
  };
  const statusOf = async (id: string) => (await call('GET', `/agents/runs/${id}`)).body;
  return { call, statusOf };
}

async function until(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('condition not reached');
}

it('delay_seconds and run_at schedule a run, which starts when it is due', async () => {
  const { call, statusOf } = await start({});
  const delayed = await call('POST', '/agents/echo/runs', { input: 'later', delay_seconds: 0.3 });
  expect(delayed.status).toBe(202);
  expect(delayed.body.status).toBe('scheduled');
  expect(delayed.body.scheduled_for).toBeGreaterThanOrEqual(delayed.body.created_at);
  await until(async () => (await statusOf(delayed.body.id)).status === 'succeeded');
  const at = await call('POST', '/agents/echo/runs', {
    input: 'at a time',
    run_at: new Date(Date.now() + 200).toISOString(),
  });
  expect(at.body.status).toBe('scheduled');
  await until(async () => (await statusOf(at.body.id)).status === 'succeeded');
  expect((await statusOf(at.body.id)).output).toEqual({ text: 'done at a time' });
});

it('a due default-class run waits, scheduled, while the tenant is at its cap; it counts for no cap until then', async () => {
  const { call, statusOf } = await start({ maxActivePerTenant: 1 });
  const blocker = await call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
  await until(async () => (await statusOf(blocker.body.id)).status === 'running');
  // Not refused: a scheduled run takes no place until it is due.
  const scheduled = await call('POST', '/agents/echo/runs', {
    input: 'when there is room',
    delay_seconds: 0,
  });
  expect(scheduled.status).toBe(202);
  await new Promise((r) => setTimeout(r, 600));
  expect((await statusOf(scheduled.body.id)).status).toBe('scheduled');
  await call('POST', `/agents/runs/${blocker.body.id}/cancel`);
  await until(async () => (await statusOf(scheduled.body.id)).status === 'succeeded');
});

it('a scheduled run that cannot start within AGENT_DEFERRED_MAX_WAIT_MS of becoming due fails expired', async () => {
  const { call, statusOf } = await start({ maxActivePerTenant: 1, deferredMaxWaitMs: 300, nodeStaleMs: 400 });
  const blocker = await call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
  await until(async () => (await statusOf(blocker.body.id)).status === 'running');
  const scheduled = await call('POST', '/agents/echo/runs', { input: 'too late', delay_seconds: 0 });
  await until(async () => (await statusOf(scheduled.body.id)).status === 'failed');
  expect((await statusOf(scheduled.body.id)).error).toMatchObject({ type: 'expired' });
  await call('POST', `/agents/runs/${blocker.body.id}/cancel`);
});

it('refuses bad schedules, naming the field', async () => {
  const { call } = await start({});
  const both = await call('POST', '/agents/echo/runs', { input: 'x', run_at: 1, delay_seconds: 1 });
  expect(both.status).toBe(400);
  const badAt = await call('POST', '/agents/echo/runs', { input: 'x', run_at: 'next tuesday' });
  expect(badAt.body.error).toMatchObject({ type: 'invalid_request', field: 'run_at' });
  const badDelay = await call('POST', '/agents/echo/runs', { input: 'x', delay_seconds: -1 });
  expect(badDelay.body.error).toMatchObject({ field: 'delay_seconds' });
});
