import { expect, it } from 'vitest';
import { startTestServer as start, until } from '../helpers.js';

it('deferred runs: their own running cap per tenant, their own queue cap, and no effect on default-class runs', async () => {
  const { call, statusOf } = await start({
    settings: {
      deferredMaxRunningPerTenant: 2,
      deferredMaxQueuedPerTenant: 3,
      deferredConcurrency: 4,
      // One default-class worker: a deferred run on it would leave a queued default run waiting.
      runConcurrency: 1,
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

  // Interactive work is not held up by the deferred backlog: a queued default-class run (which,
  // unlike an inline one, needs a queue worker) finishes while the backlog stalls.
  const interactive = await call('POST', '/agents/echo/runs', { input: 'hello', wait: false });
  expect(interactive.status).toBe(202);
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
  const waited = await call('POST', '/agents/echo/runs', { input: 'patient', class: 'deferred', wait: true });
  expect(waited.status).toBe(202);
  expect(waited.body.status).toBe('queued');
});

it('R16: a caller that waits on a deferred run is answered after the wait window, not at once: 202 with the run as it then is, or 200 when it finished in the window', async () => {
  const t = await start({ settings: { syncTimeoutMs: 400, deferredConcurrency: 1 } });
  const sentAt = Date.now();
  const slow = await t.call('POST', '/agents/echo/runs', {
    input: 'stall slow',
    class: 'deferred',
    wait: true,
  });
  // Not before the window: answered at admission, as wait: false is, it would come at once.
  expect(Date.now() - sentAt).toBeGreaterThanOrEqual(400);
  expect(slow.status).toBe(202);
  expect(['queued', 'running']).toContain(slow.body.status);
  const immediate = await t.call('POST', '/agents/echo/runs', {
    input: 'stall other',
    class: 'deferred',
    wait: false,
  });
  expect(immediate.body.status).toBe('queued');
  await t.call('POST', `/agents/runs/${slow.body.id}/cancel`);
  await t.call('POST', `/agents/runs/${immediate.body.id}/cancel`);

  const quick = await t.call('POST', '/agents/echo/runs', { input: 'quick', class: 'deferred', wait: true });
  // Executed by a deferred worker, not inline, and the caller still gets its output.
  expect([200, 202]).toContain(quick.status);
  await until(async () => (await t.statusOf(quick.body.id)).status === 'succeeded', 'the quick deferred run');
  expect(quick.body.class).toBe('deferred');
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
