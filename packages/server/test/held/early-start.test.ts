import pg from 'pg';
import { expect, it } from 'vitest';
import { createAgent, createConcurrencyLimiter } from 'sluice';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import {
  afterThisTest,
  deferred,
  freshDatabase,
  lastUserText,
  postgres,
  startTestServer,
  until,
  type TestServer,
} from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';
import { openStream } from './sse.js';
import { getEvents, readEvents } from '../streams/sse-get.js';

/*
 * A held run whose tenant's counts this process expects to fit starts its agent while its
 * admission statement is on its way (runs/early-start.ts): the provider request no longer waits
 * for the database. What must hold is what held before: nothing of the run reaches its caller or
 * the store until it is admitted; a run refused after all leaves no trace, its provider request
 * aborted and its slot freed; and a tenant this process knows to be at its cap starts nothing.
 */

const CAP = 2;

/** A stand-in that hangs on "stall" until the caller leaves, and answers anything else. */
async function standIn(): Promise<ProviderStandIn> {
  const provider = await startProviderStandIn({
    reply: (r) => (lastUserText(r).includes('stall') ? { stall: true } : { text: `done ${lastUserText(r)}` }),
  });
  afterThisTest(() => provider.close());
  return provider;
}

/** Sessions waiting for an advisory lock in the test's database (admissions held at the tenant lock). */
async function lockWaiters(client: pg.Client): Promise<number> {
  return (
    await client.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
    )
  ).rows[0]!.n;
}

async function blockerOf(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  afterThisTest(() => client.end());
  return client;
}

const runsUrl = (t: TestServer, agent = 'echo') => `${t.server.url}/api/client/v1/agents/${agent}/runs`;

/** A streamed run read to its end; its events. */
async function streamed(t: TestServer, input: string, agent = 'echo') {
  const stream = await openStream(runsUrl(t, agent), t.admin, { input, stream: true });
  expect(stream.status).toBe(200);
  return stream.rest();
}

/**
 * A server on a fresh PostgreSQL database whose tenant `t` (cap CAP) has had one run, so the
 * process knows its counts; then the tenant's admission lock taken by `blocker`, so the next
 * admission waits at it until `unlock`.
 */
async function lockedTenant(provider: ProviderStandIn) {
  const databaseUrl = await freshDatabase();
  const t = await startTestServer({ provider, databaseUrl, tenants: { t: { maxConcurrentAgentRuns: CAP } } });
  await streamed(t, 'first');
  const blocker = await blockerOf(databaseUrl);
  await blocker.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:t'))`);
  const unlock = () => blocker.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:t'))`);
  return { t, blocker, unlock };
}

describeWith({ PostgreSQL: postgres })('held runs started while their admission commits', () => {
  it('the provider request starts while admission waits at the tenant lock; the caller hears nothing until the run is admitted, then every event in order', async () => {
    const provider = await standIn();
    const { t, blocker, unlock } = await lockedTenant(provider);
    let answered = false;
    const opening = openStream(runsUrl(t), t.admin, { input: 'second', stream: true }).then((s) => {
      answered = true;
      return s;
    });
    await until(async () => (await lockWaiters(blocker)) === 1, 'the admission waiting for the tenant lock');
    await until(() => provider.requests.length === 2, 'the provider request of the waiting run');
    const early = provider.requests[1]!;
    await until(() => early.done, 'the provider answering in full');
    // Admission still waits: no answer to the caller, no row, no stored event of the run.
    expect(answered).toBe(false);
    expect((await blocker.query(`SELECT count(*)::int AS n FROM agent_runs`)).rows[0].n).toBe(1);
    expect(
      (await blocker.query(`SELECT count(*)::int AS n FROM agent_run_events`)).rows[0].n,
    ).toBeLessThanOrEqual(
      // The first run's events, at most; none of the second's (it has no row to hang them on).
      (
        await blocker.query(
          `SELECT count(*)::int AS n FROM agent_run_events e JOIN agent_runs r ON r.id = e.run_id`,
        )
      ).rows[0].n,
    );

    await unlock();
    const stream = await opening;
    expect(stream.status).toBe(200);
    const events = await stream.rest();
    const names = events.map((e) => e.event);
    expect(names[0]).toBe('run.created');
    expect(names[1]).toBe('run.started');
    expect(names.at(-1)).toBe('run.completed');
    expect(names.slice(2, -1).every((n) => n === 'message.delta')).toBe(true);
    const id = events[0]!.data.id as string;
    expect(events.every((e) => (e.data.id ?? e.data.run_id) === id)).toBe(true);
    expect(events.at(-1)!.data).toMatchObject({ status: 'succeeded', output: { text: 'done second' } });
    // The run.started event is the admitted row's, not a guess made before it existed.
    const row = await t.statusOf(id);
    expect(events[1]!.data.created_at).toBe(row.created_at);

    // The stored stream is the one the caller read, ids from 1 on.
    const stored = await readEvents(await getEvents(t.server.url, t.admin, id));
    expect(stored.map((e) => e.id)).toEqual(events.map((_, i) => i + 1));
    expect(stored.map((e) => e.event)).toEqual(names);
  }, 30_000);

  it('refused after all (another process filled the cap meanwhile): 429, no row, no event, the provider request aborted and the slot freed', async () => {
    const provider = await standIn();
    const databaseUrl = await freshDatabase();
    const tenants = { t: { maxConcurrentAgentRuns: CAP } };
    // Server a's `one` agent has a limiter of one slot: a slot kept by the refused run would
    // hold every later run of it.
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const a = await startTestServer({
      provider,
      databaseUrl,
      tenants,
      agents: (model) => ({
        one: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
      }),
    });
    const b = await startTestServer({ provider, databaseUrl, tenants });
    await streamed(a, 'warm', 'one');
    // a expects one run of two (its own, ended since): room for another.
    const stalls = await Promise.all(
      [1, 2].map(() =>
        openStream(runsUrl(b), b.admin, { input: 'stall', stream: true, on_disconnect: 'cancel' }),
      ),
    );
    for (const s of stalls) expect((await s.next())?.event).toBe('run.created');
    await until(() => provider.requests.length === 3, 'both of b’s runs at the provider');

    const refused = await openStream(runsUrl(a, 'one'), a.admin, { input: 'third', stream: true });
    expect(refused.status).toBe(429);
    expect(await refused.json()).toMatchObject({ error: { code: 'agent_run_concurrency_limit' } });
    // It had started early: its provider request came, and was cut when the refusal came.
    expect(provider.requests.length).toBe(4);
    await until(
      () => provider.requests[3]!.aborted || provider.requests[3]!.done,
      'the early request ending',
    );
    const rows = await a.call('GET', '/agents/runs');
    expect(rows.body.data).toHaveLength(3);
    const orphans = await blockerOf(databaseUrl).then((c) =>
      c.query(
        `SELECT count(*)::int AS n FROM agent_run_events WHERE run_id NOT IN (SELECT id FROM agent_runs)`,
      ),
    );
    expect(orphans.rows[0].n).toBe(0);
    await until(async () => (await limiter.stats()).active === 0, 'the refused run’s slot given back');

    for (const s of stalls) s.close();
    await until(
      async () =>
        (await b.call('GET', '/agents/runs')).body.data.every(
          (r: { status: string }) => r.status !== 'running',
        ),
      'b’s runs ending',
    );
    // The slot is free: a's next run of `one` goes through.
    const events = await streamed(a, 'fourth', 'one');
    expect(events.at(-1)!.data).toMatchObject({ status: 'succeeded', output: { text: 'done fourth' } });
  }, 30_000);

  it('a tenant this process knows to be at its cap starts nothing early: refused requests never reach the provider', async () => {
    const provider = await standIn();
    const databaseUrl = await freshDatabase();
    const t = await startTestServer({
      provider,
      databaseUrl,
      tenants: { t: { maxConcurrentAgentRuns: CAP } },
    });
    const stalls = await Promise.all(
      [1, 2].map(() => openStream(runsUrl(t), t.admin, { input: 'stall', stream: true })),
    );
    for (const s of stalls) expect((await s.next())?.event).toBe('run.created');
    await until(() => provider.requests.length === 2, 'both runs at the provider');
    const refusals = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        openStream(runsUrl(t), t.admin, { input: `flood ${i}`, stream: true }),
      ),
    );
    expect(refusals.map((r) => r.status)).toEqual(Array(20).fill(429));
    expect(provider.requests).toHaveLength(2);
    for (const s of stalls) s.close();
  }, 30_000);

  it("a caller that leaves while its early-started run waits for admission (on_disconnect: 'cancel'): the run ends canceled and its provider request is cut", async () => {
    const provider = await standIn();
    const { t, blocker, unlock } = await lockedTenant(provider);
    const controller = new AbortController();
    const leaving = fetch(runsUrl(t), {
      method: 'POST',
      headers: { authorization: `Bearer ${t.admin}`, 'content-type': 'application/json' },
      body: JSON.stringify({ input: 'stall', stream: true, on_disconnect: 'cancel' }),
      signal: controller.signal,
    }).catch(() => undefined);
    await until(async () => (await lockWaiters(blocker)) === 1, 'the admission waiting for the tenant lock');
    await until(() => provider.requests.length === 2, 'the early provider request');
    controller.abort();
    await leaving;
    // Cut while admission still waits, not once the run is admitted.
    await until(() => provider.requests[1]!.aborted, 'the provider request cut');
    expect(await lockWaiters(blocker)).toBe(1);
    await unlock();
    await until(
      async () =>
        (await t.call('GET', '/agents/runs')).body.data.some(
          (r: { status: string }) => r.status === 'canceled',
        ),
      'the run ending canceled',
    );
  }, 30_000);

  it('projects at their caps, asked in turn: refused requests never reach the provider (a read of one project does not make the process forget the other)', async () => {
    const provider = await standIn();
    const databaseUrl = await freshDatabase();
    const t = await startTestServer({ provider, databaseUrl, settings: { maxActivePerProject: 1 } });
    const p1 = await t.token({ project: 'p1' });
    const p2 = await t.token({ project: 'p2' });
    const stalls = [];
    for (const token of [p1, p2]) {
      const s = await openStream(runsUrl(t), token, {
        input: 'stall',
        stream: true,
        on_disconnect: 'cancel',
      });
      expect((await s.next())?.event).toBe('run.created');
      stalls.push(s);
    }
    await until(() => provider.requests.length === 2, 'both runs at the provider');
    for (let i = 0; i < 10; i++) {
      const r = await openStream(runsUrl(t), i % 2 === 0 ? p1 : p2, { input: `flood ${i}`, stream: true });
      expect(r.status).toBe(429);
      await r.json();
    }
    expect(provider.requests).toHaveLength(2);
    for (const s of stalls) s.close();
    await until(
      async () =>
        (await t.call('GET', '/agents/runs')).body.data.every(
          (r: { status: string }) => r.status !== 'running',
        ),
      'the stalled runs ending',
    );
  }, 30_000);

  it('the node stopping its runs as lost (its heartbeat failed) leaves a run still in admission alone: it returns at once, and the run, once admitted, ends as it would have', async () => {
    const answer = deferred();
    const provider = await startProviderStandIn({
      reply: async (r) => {
        if (lastUserText(r) === 'held back') await answer.promise;
        return { text: `done ${lastUserText(r)}` };
      },
    });
    afterThisTest(() => provider.close());
    afterThisTest(() => answer.resolve());
    const { t, blocker, unlock } = await lockedTenant(provider);
    const opening = openStream(runsUrl(t), t.admin, { input: 'held back', stream: true });
    await until(async () => (await lockWaiters(blocker)) === 1, 'the admission waiting for the tenant lock');
    await until(() => provider.requests.length === 2, 'the early provider request');
    // What node/upkeep.ts does when the heartbeat failed: it must not wait for admissions.
    await t.server.executor.stopAll('lost');
    expect(await lockWaiters(blocker)).toBe(1);
    await unlock();
    answer.resolve();
    const events = await (await opening).rest();
    expect(events.at(-1)).toMatchObject({ event: 'run.completed', data: { status: 'succeeded' } });
    expect((await t.statusOf(events[0]!.data.id as string)).status).toBe('succeeded');
  }, 30_000);
});
