import { expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { startAgentServer } from './harness.js';

it('M12: a tenant limited to some agents gets 404 for the others, as if they did not exist; other tenants do not', async () => {
  const { call, token } = await startAgentServer({
    tenants: { acme: { agents: ['echo'] } },
    agents: (model) => ({
      echo: createAgent({ model, credentials: { apiKey: 'k' } }),
      analyst: createAgent({ model, credentials: { apiKey: 'k' } }),
    }),
  });
  const acme = await token({ tenant: 'acme' });
  const globex = await token({ tenant: 'globex' });

  const hidden = await call('POST', '/agents/analyst/runs', acme, { input: 'hello' });
  expect(hidden.status).toBe(404);
  expect(hidden.body.error).toMatchObject({ type: 'not_found' });
  // The same answer as for an agent that does not exist at all.
  const missing = await call('POST', '/agents/nobody/runs', acme, { input: 'hello' });
  expect(missing.status).toBe(404);
  expect(hidden.body.error.message.replace('analyst', 'nobody')).toBe(missing.body.error.message);

  expect((await call('POST', '/agents/echo/runs', acme, { input: 'hello' })).body.status).toBe('succeeded');
  expect((await call('POST', '/agents/analyst/runs', globex, { input: 'hello' })).body.status).toBe(
    'succeeded',
  );
  // A refused call left no run behind.
  const listed = await call('GET', '/agents/runs', acme);
  expect(listed.body.data.map((r: { agent: string }) => r.agent)).toEqual(['echo']);
  // Names of the config object's prototype are no agents, for anyone.
  for (const name of ['constructor', '__proto__', 'toString']) {
    expect((await call('POST', `/agents/${name}/runs`, globex, { input: 'hello' })).status).toBe(404);
  }
}, 60_000);
