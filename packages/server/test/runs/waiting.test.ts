import { createAgent, createConcurrencyLimiter } from 'sluice';
import { describe, expect, it } from 'vitest';
import { startTestServer, until } from '../helpers.js';

// The default stand-in: "stall" in the prompt hangs until the run is stopped.
describe('runs that say why they wait (`waiting`)', () => {
  it('schedule, tenant_cap, worker and thread; a running or finished run has none; lists carry it; the dashboard counts it per tenant', async () => {
    const t = await startTestServer({ settings: { maxActivePerTenant: 2, runConcurrency: 1 } });
    const who = await t.token({ tenant: 'waits', role: 'admin' });
    const get = async (id: string) => (await t.call('GET', `/agents/runs/${id}`, undefined, who)).body;

    const later = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: 'x', wait: false, delay_seconds: 3600 },
      who,
    );
    expect(later.status).toBe(202);
    const scheduled = await get(later.body.id as string);
    expect(scheduled.waiting).toEqual({ reason: 'schedule', estimated_start_at: scheduled.scheduled_for });

    // The one queue worker takes a stalled run; the next queued run waits for a worker.
    const thread = (await t.call('POST', '/threads', {}, who)).body.id as string;
    const busy = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: 'stall', wait: false, thread_id: thread },
      who,
    );
    await until(
      async () => (await get(busy.body.id as string)).status === 'running',
      'the stalled run running',
    );
    expect((await get(busy.body.id as string)).waiting).toBeUndefined();
    const onThread = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: 'next', wait: false, thread_id: thread },
      who,
    );
    expect((await get(onThread.body.id as string)).waiting).toEqual({ reason: 'thread' });

    // Two active runs fill the tenant's cap of 2: the scheduled run, due now, waits for room.
    await t.server.store.db.query(
      `UPDATE agent_runs SET scheduled_for = clock_timestamp() - interval '1 second' WHERE id = $1`,
      [later.body.id],
    );
    const due = await get(later.body.id as string);
    expect(due.status).toBe('scheduled');
    expect(due.waiting.reason).toBe('tenant_cap');
    expect(due.waiting.estimated_start_at).toBeGreaterThanOrEqual(Math.floor(Date.now() / 1000) - 5);

    const list = (await t.call('GET', '/agents/runs', undefined, who)).body.data as {
      id: string;
      waiting?: unknown;
    }[];
    const byId = new Map(list.map((r) => [r.id, r.waiting]));
    expect(byId.get(busy.body.id as string)).toBeUndefined();
    expect(byId.get(onThread.body.id as string)).toEqual({ reason: 'thread' });
    expect(byId.get(later.body.id as string)).toMatchObject({ reason: 'tenant_cap' });

    const overview = (await t.call('GET', '/ops/overview', undefined, who)).body;
    expect(overview.waiting).toEqual(
      expect.arrayContaining([
        { tenant: 'waits', reason: 'tenant_cap', count: 1 },
        { tenant: 'waits', reason: 'thread', count: 1 },
      ]),
    );

    // Finished: no `waiting`.
    await t.call('POST', `/agents/runs/${busy.body.id}/cancel`, undefined, who);
    await until(
      async () => (await get(onThread.body.id as string)).status === 'succeeded',
      'the thread run done',
    );
    expect((await get(onThread.body.id as string)).waiting).toBeUndefined();
  });

  it('a queued run with no free worker waits for `worker`; a deferred one past the running cap for `deferred_running_cap`', async () => {
    const t = await startTestServer({
      settings: { runConcurrency: 1, deferredConcurrency: 2, deferredMaxRunningPerTenant: 1 },
    });
    const get = async (id: string) => (await t.call('GET', `/agents/runs/${id}`)).body;
    const first = await t.call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
    await until(async () => (await get(first.body.id as string)).status === 'running', 'the worker busy');
    const second = await t.call('POST', '/agents/echo/runs', { input: 'x', wait: false });
    expect((await get(second.body.id as string)).waiting).toEqual({ reason: 'worker' });

    const d1 = await t.call('POST', '/agents/echo/runs', { input: 'stall', class: 'deferred' });
    await until(async () => (await get(d1.body.id as string)).status === 'running', 'a deferred run running');
    const d2 = await t.call('POST', '/agents/echo/runs', { input: 'x', class: 'deferred' });
    expect((await get(d2.body.id as string)).waiting).toEqual({ reason: 'deferred_running_cap' });
    for (const id of [first.body.id, d1.body.id]) await t.call('POST', `/agents/runs/${id}/cancel`);
  });

  it('a queued run whose agent’s provider requests wait for a slot waits for `provider_slot`; `worker` once none waits', async () => {
    // One provider slot, two queue workers: the first run holds the slot, the second is claimed
    // and waits for it, so both workers are busy and the third, queued, waits behind the slot.
    const limiter = createConcurrencyLimiter({ name: 'one-slot', maxConcurrent: 1 });
    const t = await startTestServer({
      settings: { runConcurrency: 2 },
      agents: (model) => ({
        limited: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
      }),
    });
    const get = async (id: string) => (await t.call('GET', `/agents/runs/${id}`)).body;
    const post = async (input: string) =>
      (await t.call('POST', '/agents/limited/runs', { input, wait: false })).body.id as string;
    const holder = await post('stall');
    await until(async () => (await limiter.stats()).active === 1, 'the first run holding the slot');
    const second = await post('stall');
    await until(async () => (await limiter.stats()).queued === 1, 'the second run waiting for the slot');
    expect((await get(second)).status).toBe('running');
    expect((await get(second)).waiting).toBeUndefined();
    const third = await post('x');
    expect((await get(third)).status).toBe('queued');
    expect((await get(third)).waiting).toEqual({ reason: 'provider_slot' });
    const overview = (await t.call('GET', '/ops/overview', undefined, t.admin)).body;
    expect(overview.waiting).toEqual(
      expect.arrayContaining([{ tenant: 't', reason: 'provider_slot', count: 1 }]),
    );

    // The holder canceled: the second takes the slot. The holder's worker is free again and may
    // claim the third at once (then it runs, waiting for the slot inside, with no `waiting`);
    // while it is still queued, nothing it waits for is a slot any more: it waits for `worker`.
    await t.call('POST', `/agents/runs/${holder}/cancel`);
    await until(async () => {
      const ended = !['queued', 'running'].includes((await get(holder)).status as string);
      return ended && (await limiter.stats()).active === 1 && (await get(second)).status === 'running';
    }, 'the holder ended and its slot passed to the second');
    const still = await get(third);
    if (still.status === 'queued') expect(still.waiting).toEqual({ reason: 'worker' });
    else expect(still.waiting).toBeUndefined();
    for (const id of [second, third]) await t.call('POST', `/agents/runs/${id}/cancel`);
  });

  it('a 429 of the runs API carries RateLimit-Policy and RateLimit beside Retry-After', async () => {
    const t = await startTestServer({ settings: { maxActivePerTenant: 1 } });
    const held = await t.call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
    expect(held.status).toBe(202);
    const refused = await t.call('POST', '/agents/echo/runs', { input: 'x', wait: false });
    expect(refused.status).toBe(429);
    const seconds = Number(refused.headers.get('retry-after'));
    expect(seconds).toBeGreaterThan(0);
    expect(refused.headers.get('ratelimit-policy')).toBe('"max_active_runs";q=1');
    expect(refused.headers.get('ratelimit')).toBe(`"max_active_runs";r=0;t=${seconds}`);
    await t.call('POST', `/agents/runs/${held.body.id}/cancel`);
  });
});
