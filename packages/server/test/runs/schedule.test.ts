import { expect, it } from 'vitest';
import { promotionPass } from '../../src/runs/scheduler.js';
import { startTestServer as start, until } from '../helpers.js';
import { limits } from '../limits/admission-fixtures.js';

it('delay_seconds and run_at schedule a run, which starts when it is due', async () => {
  const { call, statusOf } = await start();
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
}, 60_000);

it('a due default-class run waits, scheduled, while the tenant is at its cap; it counts for no cap until then', async () => {
  const { call, statusOf, server } = await start({ settings: { maxActivePerTenant: 1 } });
  const blocker = await call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
  await until(async () => (await statusOf(blocker.body.id)).status === 'running');
  // Not refused: a scheduled run takes no place until it is due.
  const scheduled = await call('POST', '/agents/echo/runs', {
    input: 'when there is room',
    delay_seconds: 0,
  });
  expect(scheduled.status).toBe(202);
  // It is due, but a promotion pass leaves it where it is while the cap is taken.
  expect(await server.upkeep.promoteNow()).toBe(0);
  expect((await statusOf(scheduled.body.id)).status).toBe('scheduled');
  await call('POST', `/agents/runs/${blocker.body.id}/cancel`);
  await until(async () => (await statusOf(scheduled.body.id)).status === 'succeeded');
});

it('a scheduled run that cannot start within AGENT_DEFERRED_MAX_WAIT_MS of becoming due fails expired', async () => {
  const { call, statusOf } = await start({
    settings: { maxActivePerTenant: 1, deferredMaxWaitMs: 300, nodeStaleMs: 400 },
  });
  const blocker = await call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
  await until(async () => (await statusOf(blocker.body.id)).status === 'running');
  const scheduled = await call('POST', '/agents/echo/runs', { input: 'too late', delay_seconds: 0 });
  await until(async () => (await statusOf(scheduled.body.id)).status === 'failed');
  expect((await statusOf(scheduled.body.id)).error).toMatchObject({ type: 'expired' });
  await call('POST', `/agents/runs/${blocker.body.id}/cancel`);
});

it('refuses bad schedules, naming the field', async () => {
  const { call } = await start();
  const both = await call('POST', '/agents/echo/runs', { input: 'x', run_at: 1, delay_seconds: 1 });
  expect(both.status).toBe(400);
  const badAt = await call('POST', '/agents/echo/runs', { input: 'x', run_at: 'next tuesday' });
  expect(badAt.body.error).toMatchObject({ type: 'invalid_request', field: 'run_at' });
  const badDelay = await call('POST', '/agents/echo/runs', { input: 'x', delay_seconds: -1 });
  expect(badDelay.body.error).toMatchObject({ field: 'delay_seconds' });
});

it('a promotion pass says whether any run waits for its time, due or not', async () => {
  const { call, server } = await start();
  const pass = () => promotionPass(server.store.db, () => limits());
  expect(await pass()).toEqual({ promoted: 0, waiting: false });
  const later = await call('POST', '/agents/echo/runs', { input: 'in an hour', delay_seconds: 3600 });
  expect(later.body.status).toBe('scheduled');
  expect(await pass()).toEqual({ promoted: 0, waiting: true });
  await call('POST', `/agents/runs/${later.body.id}/cancel`);
  expect(await pass()).toEqual({ promoted: 0, waiting: false });
});
