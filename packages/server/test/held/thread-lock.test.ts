import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, postgres, startTestServer, until, type Body } from '../helpers.js';
import { lockThread } from '../../src/threads/store.js';
import { gate, send, startServer, testDatabase } from '../process/harness.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * A stand-in whose answers to prompts containing "hold" wait for `release()`; "stall" never
 * answers; the order of the prompts it received is in `order`.
 */
async function gatedProvider() {
  const order: string[] = [];
  let held = gate();
  const provider = await startProviderStandIn({
    reply: async (r) => {
      const last = lastUserText(r);
      order.push(last);
      if (last.includes('stall')) return { stall: true };
      if (last.includes('hold')) await held.promise;
      return { text: `done ${last}` };
    },
  });
  afterThisTest(() => provider.close());
  return {
    provider,
    order,
    release() {
      held.open();
      held = gate();
    },
  };
}

describe('one run per thread', () => {
  it('a second held run on a busy thread waits runs.threadBusyWaitMs, then gets 409 thread_busy naming the thread and its active run', async () => {
    const { provider, release } = await gatedProvider();
    const t = await startTestServer({ provider, runs: { threadBusyWaitMs: 300 } });
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const first = t.call('POST', '/agents/echo/runs', { input: 'hold 1', thread_id: thread });
    await until(() => provider.inFlight === 1, 'the first run at the provider');
    expect((await t.call('GET', `/threads/${thread}`)).body.status).toBe('busy');

    const second = await t.call('POST', '/agents/echo/runs', { input: 'two', thread_id: thread });
    expect(second.status).toBe(409);
    const running = (await t.call('GET', '/agents/runs?status=running')).body.data as Body[];
    expect(running).toHaveLength(1);
    expect(second.body.error).toMatchObject({
      type: 'thread_busy',
      code: 'thread_busy',
      thread_id: thread,
      active_run_id: running[0]!.id,
    });
    expect(second.body.error.message).toMatch(/300 ms/);
    // The refused run left nothing behind: no row, no provider request.
    expect((await t.call('GET', '/agents/runs')).body.data).toHaveLength(1);
    expect(provider.requests).toHaveLength(1);

    release();
    expect((await first).body.status).toBe('succeeded');
    expect((await t.call('GET', `/threads/${thread}`)).body.status).toBe('idle');
    const third = await t.call('POST', '/agents/echo/runs', { input: 'three', thread_id: thread });
    expect(third.status).toBe(200);
  });

  it("on_busy: 'cancel' cancels the active run (its provider request is aborted) and then runs, even with no time to wait", async () => {
    const { provider } = await gatedProvider();
    const t = await startTestServer({ provider, runs: { threadBusyWaitMs: 0 } });
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const first = t.call('POST', '/agents/echo/runs', { input: 'stall', thread_id: thread });
    await until(() => provider.inFlight === 1, 'the first run at the provider');

    const second = await t.call('POST', '/agents/echo/runs', {
      input: 'next',
      thread_id: thread,
      on_busy: 'cancel',
    });
    expect(second.status).toBe(200);
    expect(second.body).toMatchObject({ status: 'succeeded', output: { text: 'done next' } });
    const canceled = await first;
    expect(canceled.body.status).toBe('canceled');
    expect(provider.requests[0]).toMatchObject({ aborted: true, done: false });
    // The canceled run added nothing to the thread; the second did.
    const messages = (await t.call('GET', `/threads/${thread}/messages`)).body.data as Body[];
    expect(messages.map((m) => m.content)).toEqual(['next', 'done next']);
  });

  it('a queued run on a busy thread keeps its place: it waits while the thread is held (other runs go by), starts first when it frees, before a held run that came later', async () => {
    const { provider, order, release } = await gatedProvider();
    const t = await startTestServer({ provider, settings: { runConcurrency: 2 } });
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const holder = t.call('POST', '/agents/echo/runs', { input: 'hold A', thread_id: thread });
    await until(() => provider.inFlight === 1, 'A at the provider');

    const queued = await t.call('POST', '/agents/echo/runs', { input: 'B', thread_id: thread, wait: false });
    expect(queued.status).toBe(202);
    expect(queued.body.status).toBe('queued');
    // A run of no thread, queued after B, is claimed and finishes while B keeps waiting.
    const free = await t.call('POST', '/agents/echo/runs', { input: 'C', wait: false });
    await until(async () => (await t.statusOf(free.body.id)).status === 'succeeded', 'C done');
    expect((await t.statusOf(queued.body.id)).status).toBe('queued');

    // D is held and comes after B: once A ends, B goes first.
    const later = t.call('POST', '/agents/echo/runs', { input: 'D', thread_id: thread });
    // D waits for the thread before it is admitted: it shows as a caller waiting for the thread.
    await until(() => t.server.waiters.size === 1, 'D waiting for the thread');
    release();
    expect((await holder).body.status).toBe('succeeded');
    expect((await later).body.status).toBe('succeeded');
    await until(async () => (await t.statusOf(queued.body.id)).status === 'succeeded', 'B done');
    expect(order).toEqual(['hold A', 'C', 'B', 'D']);
    const messages = (await t.call('GET', `/threads/${thread}/messages`)).body.data as Body[];
    expect(messages.map((m) => m.content)).toEqual(['hold A', 'done hold A', 'B', 'done B', 'D', 'done D']);
  });
});

describe('the thread lock is a lease', () => {
  it('a holder that never renews (a process gone before its run was written) gives the thread up when the lease runs out', async () => {
    const t = await startTestServer();
    const db = t.server.store.db;
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const ghost = { id: thread, tenant: 't' };
    expect(await lockThread(db, ghost, 'run_000000000000000000000001', 300)).toEqual({ ok: true });
    expect(await lockThread(db, ghost, 'run_000000000000000000000002', 300)).toEqual({
      ok: false,
      activeRunId: 'run_000000000000000000000001',
    });
    expect((await t.call('GET', `/threads/${thread}`)).body.status).toBe('busy');
    await until(
      async () => (await t.call('GET', `/threads/${thread}`)).body.status === 'idle',
      'the lease running out',
    );
    expect((await t.call('POST', '/agents/echo/runs', { input: 'mine now', thread_id: thread })).status).toBe(
      200,
    );
  });

  it('a live holder keeps it: its process renews the lease with every heartbeat, past several lease lengths', async () => {
    const { provider, release } = await gatedProvider();
    // A lease of 3 x 1 s, renewed every 250 ms.
    const t = await startTestServer({
      provider,
      settings: { nodeStaleMs: 1000 },
      runs: { threadBusyWaitMs: 0 },
    });
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const holder = t.call('POST', '/agents/echo/runs', { input: 'hold', thread_id: thread });
    await until(() => provider.inFlight === 1, 'the holder at the provider');
    const lease = async () =>
      (
        await t.server.store.db.query<{ expires: number; now: number }>(
          `SELECT extract(epoch FROM lock_expires_at)::float8 AS expires, extract(epoch FROM clock_timestamp())::float8 AS now
           FROM threads WHERE id = $1`,
          [thread],
        )
      ).rows[0]!;
    const first = (await lease()).expires;
    // Past the end of the lease as it was first taken: without renewal the thread would be free.
    await until(async () => (await lease()).now > first, 'the first lease length passing');
    expect((await lease()).expires).toBeGreaterThan(first);
    const refused = await t.call('POST', '/agents/echo/runs', { input: 'x', thread_id: thread });
    expect(refused.status).toBe(409);
    release();
    expect((await holder).body.status).toBe('succeeded');
  });
});

describeWith({ PostgreSQL: postgres })('the thread lock across processes', () => {
  it('a killed holder (kill -9) gives the thread up: a held run on another process waits, then gets it once the holder is declared lost', async () => {
    const database = await testDatabase();
    const { provider } = await gatedProvider();
    const env = {
      DATABASE_URL: database.url,
      PROVIDER_URL: provider.url,
      SLUICE_NODE_STALE_MS: '1500',
      SLUICE_THREAD_BUSY_WAIT_MS: '60000',
    };
    const a = await startServer(env);
    const b = await startServer(env);
    const { secret: token } = await database.token();
    const api = '/api/client/v1';
    const thread = (await send(b.url, 'POST', `${api}/threads`, { token, body: {} })).body.id as string;

    void send(a.url, 'POST', `${api}/agents/echo/runs`, {
      token,
      body: { input: 'stall', thread_id: thread },
    });
    await until(() => provider.inFlight === 1, 'the holder at the provider');
    const waiting = send(b.url, 'POST', `${api}/agents/echo/runs`, {
      token,
      body: { input: 'after the crash', thread_id: thread },
    });
    a.child.kill('SIGKILL');
    const answer = await waiting;
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ status: 'succeeded', output: { text: 'done after the crash' } });
    const runs = await database.rows<{ input: unknown; status: string; type: string | null }>(
      `SELECT input, status, error ->> 'type' AS type FROM agent_runs ORDER BY seq`,
    );
    expect(runs).toEqual([
      { input: 'stall', status: 'failed', type: 'worker_lost' },
      { input: 'after the crash', status: 'succeeded', type: null },
    ]);
    b.child.kill('SIGTERM');
    expect(await b.closed).toEqual({ code: 0, signal: null });
  }, 180_000);

  it('two processes racing for one idle thread: exactly one run holds it at a time, the other waits its turn', async () => {
    const database = await testDatabase();
    const { provider, release } = await gatedProvider();
    const env = { DATABASE_URL: database.url, PROVIDER_URL: provider.url };
    const a = await startServer(env);
    const b = await startServer(env);
    const { secret: token } = await database.token();
    const api = '/api/client/v1';
    const thread = (await send(a.url, 'POST', `${api}/threads`, { token, body: {} })).body.id as string;
    const answers = [a, b].map((s, i) =>
      send(s.url, 'POST', `${api}/agents/echo/runs`, {
        token,
        body: { input: `hold ${i}`, thread_id: thread },
      }),
    );
    await until(() => provider.requests.length >= 1, 'one run at the provider');
    // However long we look, the other stays out while the first is held.
    for (let i = 0; i < 20; i++) {
      expect(provider.inFlight).toBe(1);
      await new Promise((r) => setTimeout(r, 25));
    }
    release();
    await until(() => provider.requests.length === 2, 'the second run at the provider');
    release();
    for (const answer of await Promise.all(answers)) expect(answer.body.status).toBe('succeeded');
    expect(provider.peakInFlight).toBe(1);
    a.child.kill('SIGTERM');
    b.child.kill('SIGTERM');
    await Promise.all([a.closed, b.closed]);
  }, 180_000);
});
