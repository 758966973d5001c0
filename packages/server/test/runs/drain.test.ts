import { ownServer, ownStandIn, preparedDataDir, until } from '../helpers.js';
import { expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';

it('SIGTERM drain: runs that finish in the drain time succeed, the rest end interrupted and their callers get 503', async () => {
  const dir = await preparedDataDir();
  const provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => {
        const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
        return last.includes('stall') ? { stall: true } : { text: `done ${last}` };
      },
      latencyMs: (r) => (JSON.stringify(r.messages).includes('quick') ? 150 : 0),
    }),
  );
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const server = await serve({
    config: defineConfig({
      agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) },
      // Room for the quick run (150 ms) on a loaded machine; the stalled one is cut at the end either way.
      settings: { drainTimeoutMs: 3_000, syncTimeoutMs: 60_000 },
    }),
    port: 0,
    dataDir: dir,
    databaseUrl: '',
  });
  ownServer(server, { dir });
  const token = (await createToken(server.store.db, { tenant: 't', project: 'p', user: 'u', role: 'admin' }))
    .secret;
  const post = (input: string) =>
    fetch(`${server.url}/api/client/v1/agents/echo/runs`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ input }),
    }).then(async (r) => ({
      status: r.status,
      body: (await r.json()) as {
        status?: string;
        error?: { type: string; run?: { status: string; error: { type: string } } };
      },
    }));

  const quick = post('quick one');
  const stuck = post('stall forever');
  await until(() => server.executor.active >= 2, 'both runs executing');
  const interrupted = await server.drain();

  expect((await quick).status).toBe(200);
  expect((await quick).body.status).toBe('succeeded');
  const refused = await stuck;
  expect(refused.status).toBe(503);
  expect(refused.body.error).toMatchObject({
    type: 'agent_run_interrupted',
    run: { status: 'failed', error: { type: 'interrupted' } },
  });
  expect(interrupted).toHaveLength(1);
});

it('AGENT_BACKGROUND_MAX_DURATION_MS bounds every run: past it, failed with max_duration_exceeded', async () => {
  const dir = await preparedDataDir();
  const provider = ownStandIn(await startProviderStandIn({ reply: () => ({ stall: true }) }));
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const server = await serve({
    config: defineConfig({
      agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) },
      settings: { maxDurationMs: 300 },
    }),
    port: 0,
    dataDir: dir,
    databaseUrl: '',
  });
  ownServer(server, { dir });
  const token = (await createToken(server.store.db, { tenant: 't', project: 'p', user: 'u', role: 'admin' }))
    .secret;
  const response = await fetch(`${server.url}/api/client/v1/agents/echo/runs`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ input: 'forever' }),
  });
  const run = (await response.json()) as { status: string; error: { type: string } };
  expect(response.status).toBe(200);
  expect(run).toMatchObject({ status: 'failed', error: { type: 'max_duration_exceeded' } });
});
