import { expect, it } from 'vitest';
import { startTestServer as start, until } from '../helpers.js';

it('deferred runs: their own running cap per tenant, their own queue cap, and no effect on default-class runs', async () => {
  const { call, statusOf } = await start({
    settings: {
      deferredMaxRunningPerTenant: 2,
      deferredMaxQueuedPerTenant: 3,
      deferredConcurrency: 4,
      syncTimeoutMs: 300,
    },
  });
  const queue = async () => (await call('GET', '/agents/runs/queue')).body.deferred as Record<string, number>;
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
  // Estimated from how fast deferred runs leave the queue (runs/retry-after.ts): 1 to 60 s.
  expect(refused.retryAfter).toMatch(/^([1-9]|[1-5]\d|60)$/);
  expect(Number(refused.retryAfter)).toBe(Math.ceil(refused.body.error.retry_after_ms / 1000));
  expect(refused.body.error).toMatchObject({
    type: 'agent_run_concurrency_limit',
    class: 'deferred',
    limit_value: 3,
  });
  expect(await queue()).toMatchObject({ running: 2, queued: 3, running_limit: 2, queued_limit: 3 });

  // Interactive work is not held up by the deferred backlog: it finishes while the backlog stalls
  // (answered inline, or after the short sync window of this test on a slow machine).
  const interactive = await call('POST', '/agents/echo/runs', { input: 'hello' });
  expect([200, 202]).toContain(interactive.status);
  await until(
    async () => (await statusOf(interactive.body.id)).status === 'succeeded',
    'the interactive run',
  );
  expect((await statusOf(interactive.body.id)).output).toEqual({ text: 'done hello' });
  expect(await queue()).toMatchObject({ running: 2, queued: 3 });

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
  const { call } = await start({
    settings: { deferredMaxRunningPerTenant: 1, deferredMaxWaitMs: 200, nodeStaleMs: 400 },
  });
  await call('POST', '/agents/echo/runs', { input: 'stall first', class: 'deferred', wait: false });
  const second = await call('POST', '/agents/echo/runs', { input: 'second', class: 'deferred', wait: false });
  await until(async () => (await call('GET', `/agents/runs/${second.body.id}`)).body.status === 'failed');
  const run = await call('GET', `/agents/runs/${second.body.id}`);
  expect(run.body.error).toMatchObject({ type: 'expired' });
  expect(run.body.started_at).toBeNull();
});
