import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type Body, type TestServer } from '../helpers.js';

// What a 0 means where a cap can be 0. The settings' 0 is "no cap" (the spec's words for
// AGENT_RUN_MAX_ACTIVE_PER_TENANT, AGENT_RUN_MAX_ACTIVE_PER_PROJECT); a tenant's own quota of 0
// concurrent runs is a tenant that may run nothing, whatever the setting.

let t: TestServer;
const tokens: Record<string, string> = {};
const held: { tenant: string; id: string }[] = [];

beforeAll(async () => {
  t = await startTestServer({
    settings: { maxActivePerTenant: 0, maxActivePerProject: 0 },
    tenants: { shut: { maxConcurrentAgentRuns: 0 } },
  });
  for (const tenant of ['open', 'shut']) tokens[tenant] = await t.token({ tenant, role: 'member' });
});

afterAll(async () => {
  for (const run of held)
    await t.call('POST', `/agents/runs/${run.id}/cancel`, undefined, tokens[run.tenant]);
});

const post = (tenant: string, body: Body) => t.call('POST', '/agents/echo/runs', body, tokens[tenant]);

describe('a cap of 0', () => {
  it('AGENT_RUN_MAX_ACTIVE_PER_TENANT=0 and AGENT_RUN_MAX_ACTIVE_PER_PROJECT=0: no cap, so a tenant keeps as many runs as it sends', async () => {
    for (let i = 0; i < 6; i++) {
      const run = await post('open', { input: 'stall', wait: false });
      expect(run.status).toBe(202);
      held.push({ tenant: 'open', id: run.body.id as string });
    }
    expect((await post('open', { input: 'and this one' })).body.status).toBe('succeeded');
  });

  it('a tenant quota maxConcurrentAgentRuns: 0 admits no default-class run, inline, queued or scheduled: 429 naming the limit 0', async () => {
    for (const body of [
      { input: 'inline' },
      { input: 'queued', wait: false },
      { input: 'later', delay_seconds: 60 },
    ]) {
      const refused = await post('shut', body);
      expect(refused.status).toBe(429);
      expect(refused.body.error).toMatchObject({
        type: 'agent_run_concurrency_limit',
        scope: 'tenant',
        class: 'default',
        limit: 'max_active_runs',
        limit_value: 0,
      });
    }
    // Nothing was written for the tenant, and the other tenant is not touched by its quota.
    expect((await t.call('GET', '/agents/runs', undefined, tokens.shut)).body.data).toEqual([]);
    expect((await post('open', { input: 'still served' })).status).toBe(200);
  });

  it('the closed tenant keeps its deferred runs, which have caps of their own', async () => {
    const deferred = await post('shut', { input: 'stall', class: 'deferred' });
    expect(deferred.status).toBe(202);
    held.push({ tenant: 'shut', id: deferred.body.id as string });
  });
});
