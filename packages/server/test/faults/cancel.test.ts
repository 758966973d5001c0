import pg from 'pg';
import { expect, it } from 'vitest';
import { afterThisTest, freshDatabase, postgres, startStandIn, startTestServer, until } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

it('M2: a scheduled run can be canceled, and then never runs', async () => {
  const { call, statusOf, server, provider } = await startTestServer();
  const run = (await call('POST', '/agents/echo/runs', { input: 'hello later', delay_seconds: 3600 })).body;
  expect(run.status).toBe('scheduled');
  const canceled = await call('POST', `/agents/runs/${run.id}/cancel`);
  expect([canceled.status, canceled.body.status]).toEqual([200, 'canceled']);
  // Even once its time has come, a promotion pass moves nothing and the provider never hears of it.
  await server.store.db.query(
    `UPDATE agent_runs SET scheduled_for = clock_timestamp() - interval '1 second' WHERE id = $1`,
    [run.id],
  );
  expect(await server.upkeep.promoteNow()).toBe(0);
  expect((await statusOf(run.id)).status).toBe('canceled');
  expect(provider.requests).toHaveLength(0);
  // Canceling again changes nothing.
  expect((await call('POST', `/agents/runs/${run.id}/cancel`)).body.status).toBe('canceled');
});

describeWith({ PostgreSQL: postgres })('cancel across processes', () => {
  it('M1: a run executing on another server stops there within about a second: its provider request aborted, its place held until then', async () => {
    const database = await freshDatabase();
    const provider = await startStandIn();
    const start = () =>
      startTestServer({ databaseUrl: database, provider, settings: { maxActivePerTenant: 1 } });
    const a = await start();
    const b = await start();
    const token = await a.token({ role: 'member' });
    const call = (on: typeof a, method: string, path: string, body?: unknown) =>
      on.call(method, path, body, token);

    // An inline run on A, stuck at the provider.
    const held = call(a, 'POST', '/agents/echo/runs', { input: 'stall here' });
    await until(() => provider.inFlight === 1, 'the run at the provider');
    const pool = new pg.Pool({ connectionString: database, max: 1 });
    pool.on('error', () => undefined); // its database is dropped after the test
    afterThisTest(() => pool.end());
    const id = (await pool.query(`SELECT id FROM agent_runs WHERE status = 'running'`)).rows[0].id as string;
    // At the cap of 1: B refuses a second run while A's is alive.
    expect((await call(b, 'POST', '/agents/echo/runs', { input: 'second', wait: false })).status).toBe(429);

    const asked = Date.now();
    const canceled = await call(b, 'POST', `/agents/runs/${id}/cancel`);
    expect(canceled.body.status).toBe('canceled');
    // A stopped it: the provider saw the request go, and the place is free again.
    await until(() => provider.inFlight === 0, 'the provider request aborted');
    expect(Date.now() - asked).toBeLessThan(5_000);
    expect((await held).body).toMatchObject({ id, status: 'canceled' });
    expect((await call(b, 'POST', '/agents/echo/runs', { input: 'third', wait: false })).status).toBe(202);
  }, 60_000);
});

it('L10: a member cancels only its own project runs; an admin of the tenant cancels any; a read token none', async () => {
  const { call, token } = await startTestServer();
  const mine = await token({ project: 'p', role: 'member' });
  const theirs = await token({ project: 'q', role: 'member' });
  const reader = await token({ project: 'p', role: 'read' });
  const run = (await call('POST', '/agents/echo/runs', { input: 'x', delay_seconds: 3600 }, mine)).body;
  const refused = await call('POST', `/agents/runs/${run.id}/cancel`, undefined, theirs);
  expect([refused.status, refused.body.error.type]).toEqual([403, 'permission_denied']);
  expect((await call('POST', `/agents/runs/${run.id}/cancel`, undefined, reader)).status).toBe(403);
  expect((await call('GET', `/agents/runs/${run.id}`, undefined, theirs)).body.status).toBe('scheduled');
  // The default token of the harness is the tenant's admin.
  expect((await call('POST', `/agents/runs/${run.id}/cancel`)).body.status).toBe('canceled');
});
