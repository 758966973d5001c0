import { ownStandIn, startTestServer, until } from '../helpers.js';
import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';

it('SIGTERM drain: runs that finish in the drain time succeed, the rest end interrupted and their callers get 503', async () => {
  const provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => {
        const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
        return last.includes('stall') ? { stall: true } : { text: `done ${last}` };
      },
      latencyMs: (r) => (JSON.stringify(r.messages).includes('quick') ? 150 : 0),
    }),
  );
  const { server, call } = await startTestServer({
    provider,
    // Room for the quick run (150 ms) on a loaded machine; the stalled one is cut at the end either way.
    settings: { drainTimeoutMs: 3_000, syncTimeoutMs: 60_000 },
  });
  const post = (input: string) => call('POST', '/agents/echo/runs', { input });

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
  const provider = ownStandIn(await startProviderStandIn({ reply: () => ({ stall: true }) }));
  const { call } = await startTestServer({ provider, settings: { maxDurationMs: 300 } });
  const response = await call('POST', '/agents/echo/runs', { input: 'forever' });
  const run = response.body;
  expect(response.status).toBe(200);
  expect(run).toMatchObject({ status: 'failed', error: { type: 'max_duration_exceeded' } });
});
