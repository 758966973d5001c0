import { ownStandIn, startTestServer, type TestServer } from '../helpers.js';
import { beforeAll, expect, it } from 'vitest';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';

let t: TestServer;
let provider: ProviderStandIn;
const tokens: Record<string, string> = {};

beforeAll(async () => {
  provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => {
        const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
        if (last.includes('stall')) return { stall: true };
        if (last.includes('fail')) return { status: 400, message: 'the model refused' };
        return { text: 'ok', usage: { input: 1000, output: 1000 } };
      },
    }),
  );
  // Priced at $1 per million tokens each way: each run costs $0.002.
  t = await startTestServer({
    provider,
    price: { input: 1, output: 1 },
    tenants: {
      quota: { runs: { limit: 3, per: 'day' } },
      spender: { spend: { limitUsd: 0.003, per: 'month' } },
    },
    settings: { maxActivePerProject: 1 },
  });
  for (const tenant of ['quota', 'spender']) tokens[tenant] = await t.token({ tenant, role: 'member' });
  tokens.p1 = await t.token({ tenant: 'proj', project: 'p1', role: 'member' });
  tokens.p2 = await t.token({ tenant: 'proj', project: 'p2', role: 'member' });
});

const post = (tenant: string, body: unknown) => t.call('POST', '/agents/echo/runs', body, tokens[tenant]);

it('the run quota: admitted runs count, a call refused for bad input or by a cap costs nothing, then 429 agent_quota_exceeded with Retry-After: 60', async () => {
  expect((await post('quota', { input: 'a' })).status).toBe(200);
  // A refused call (bad input) is not a run and costs no quota unit.
  expect((await post('quota', { input: 'b', colour: 'red' })).status).toBe(400);
  // The project's one place (maxActivePerProject: 1) taken: the next call passes the quota
  // check (2 of 3 used) and is refused by the cap, which must not spend the third unit.
  const holder = await post('quota', { input: 'stall', wait: false });
  expect(holder.status).toBe(202);
  const capped = await post('quota', { input: 'over the cap' });
  expect(capped.status).toBe(429);
  expect(capped.body.error).toMatchObject({ type: 'agent_run_concurrency_limit', scope: 'project' });
  await t.call('POST', `/agents/runs/${holder.body.id}/cancel`, undefined, tokens.quota);
  expect((await post('quota', { input: 'c' })).status).toBe(200);
  const refused = await post('quota', { input: 'd', class: 'deferred' });
  expect(refused.status).toBe(429);
  expect(refused.retryAfter).toBe('60');
  expect(refused.body.error).toMatchObject({
    type: 'agent_quota_exceeded',
    limit_value: 3,
    used: 3,
    scope: 'tenant',
  });
});

it('the spend limit: runs are priced from token usage and model prices; over it, 429 spend_limit_exceeded, not retryable', async () => {
  expect((await post('spender', { input: 'a' })).status).toBe(200); // $0.002
  expect((await post('spender', { input: 'b' })).status).toBe(200); // $0.004 > $0.003
  const refused = await post('spender', { input: 'c' });
  expect(refused.status).toBe(429);
  expect(refused.retryAfter).toBeNull();
  expect(refused.body.error).toMatchObject({ type: 'spend_limit_exceeded', limit_value: 0.003 });
  expect(refused.body.error!.spent_usd).toBeCloseTo(0.004, 6);
});

it('the project cap: 429 with scope project, while another project of the tenant still gets through', async () => {
  const held = await post('p1', { input: 'stall', wait: false });
  expect(held.status).toBe(202);
  // Queued or running, it holds the project's one place either way.
  const refused = await post('p1', { input: 'more' });
  expect(refused.status).toBe(429);
  // Estimated from how fast the tenant's runs finish (runs/retry-after.ts): 1 to 60 s.
  expect(refused.retryAfter).toMatch(/^([1-9]|[1-5]\d|60)$/);
  expect(refused.body.error).toMatchObject({
    type: 'agent_run_concurrency_limit',
    scope: 'project',
    limit_value: 1,
    class: 'default',
  });
  expect((await post('p2', { input: 'other project' })).status).toBe(200);
  await t.call('POST', `/agents/runs/${held.body.id}/cancel`, undefined, tokens.p1);
});

it('a run whose agent fails ends failed with agent_error and the reason', async () => {
  const run = await post('p2', { input: 'please fail' });
  expect(run.status).toBe(200);
  expect(run.body).toMatchObject({ status: 'failed', error: { type: 'agent_error' } });
  expect(String(run.body.error!.message)).toContain('the model refused');
});
