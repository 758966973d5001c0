import { describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { afterThisTest, startTestServer, until, type TestServer } from '../helpers.js';

// Held runs take one of their user's places (runs.maxConcurrentPerUser) before the thread and
// admission are checked (runs/submission.ts). At a cap of 1, every way such a request can end
// early must give the place back: the user's next two requests, one after the other, are let in.

const runsUrl = (t: TestServer) => `${t.server.url}/api/client/v1/agents/echo/runs`;
const run = (t: TestServer, token: string, body: object = {}) =>
  t.call('POST', '/agents/echo/runs', { input: 'x', ...body }, token);

/** A run request the test can drop mid-flight, as a client that goes away does. */
function droppable(t: TestServer, token: string, body: object) {
  const controller = new AbortController();
  const answer = fetch(runsUrl(t), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: controller.signal,
  }).then(
    (response) => response.status,
    () => 'dropped' as const,
  );
  return { drop: () => controller.abort(), answer };
}

async function twiceLetIn(t: TestServer, token: string): Promise<void> {
  for (let i = 0; i < 2; i++) {
    const answer = await run(t, token);
    expect([answer.status, answer.body.status]).toEqual([200, 'succeeded']);
  }
}

async function cancelRunning(t: TestServer): Promise<void> {
  for (const r of (await t.call('GET', '/agents/runs?status=running')).body.data)
    await t.call('POST', `/agents/runs/${r.id}/cancel`);
}

describe("the user's place is given back whenever a held run is refused or its caller leaves", () => {
  it('after 409 thread_busy, and after a tenant-cap 429 refused once the thread was taken (the thread is let go too)', async () => {
    const t = await startTestServer({
      settings: { maxActivePerTenant: 1 },
      runs: { maxConcurrentPerUser: 1, threadBusyWaitMs: 50 },
    });
    const ann = await t.token({ user: 'ann', role: 'member' });
    const bob = await t.token({ user: 'bob', role: 'member' });
    const busyThread = (await t.call('POST', '/threads')).body.id as string;
    const freeThread = (await t.call('POST', '/threads')).body.id as string;
    const holder = run(t, bob, { input: 'stall', thread_id: busyThread });
    await until(() => t.provider.inFlight === 1, "bob's run at the provider");

    expect((await run(t, ann, { thread_id: busyThread })).status).toBe(409);
    const overCap = await run(t, ann, { thread_id: freeThread });
    expect([overCap.status, overCap.body.error.scope, overCap.retryAfter !== null]).toEqual([
      429,
      'tenant',
      true,
    ]);
    expect((await t.call('GET', `/threads/${freeThread}`)).body.status).toBe('idle');

    await cancelRunning(t);
    await holder;
    await twiceLetIn(t, ann);
    expect((await run(t, ann, { thread_id: freeThread })).status).toBe(200);
  });

  it('after the client leaves while its run waits for a busy thread', async () => {
    const t = await startTestServer({ runs: { maxConcurrentPerUser: 1, threadBusyWaitMs: 60_000 } });
    const ann = await t.token({ user: 'ann', role: 'member' });
    const bob = await t.token({ user: 'bob', role: 'member' });
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const holder = run(t, bob, { input: 'stall', thread_id: thread });
    await until(() => t.provider.inFlight === 1, "bob's run at the provider");

    const waiting = droppable(t, ann, { input: 'y', thread_id: thread });
    await until(async () => (await run(t, ann)).status === 429, "ann's waiting request holds her place");
    waiting.drop();
    expect(await waiting.answer).toBe('dropped');
    await until(async () => (await run(t, ann)).status === 200, 'the place given back');
    await twiceLetIn(t, ann);

    await cancelRunning(t);
    await holder;
  });

  it('after the client leaves the sync wait of a deferred run, which goes on queued (on_disconnect does not cancel it)', async () => {
    const t = await startTestServer({ runs: { maxConcurrentPerUser: 1 }, background: false });
    const ann = await t.token({ user: 'ann', role: 'member' });
    const waiting = droppable(t, ann, {
      input: 'y',
      class: 'deferred',
      wait: true,
      on_disconnect: 'cancel',
    });
    await until(async () => (await run(t, ann)).status === 429, "ann's waiting request holds her place");
    waiting.drop();
    expect(await waiting.answer).toBe('dropped');
    await until(async () => (await run(t, ann)).status === 200, 'the place given back');
    await twiceLetIn(t, ann);
    const queued = (await t.call('GET', '/agents/runs?status=queued')).body.data;
    expect(queued).toHaveLength(1);
    await t.call('POST', `/agents/runs/${queued[0].id}/cancel`);
  });

  it("after an inline run's client leaves: on_disconnect 'cancel' cancels it, 'continue' lets it go on", async () => {
    const t = await startTestServer({ runs: { maxConcurrentPerUser: 1 } });
    const ann = await t.token({ user: 'ann', role: 'member' });
    for (const onDisconnect of ['cancel', 'continue'] as const) {
      const inline = droppable(t, ann, { input: 'stall', on_disconnect: onDisconnect });
      await until(() => t.provider.inFlight === 1, 'the run at the provider');
      const id = (await t.call('GET', '/agents/runs?status=running')).body.data[0].id as string;
      inline.drop();
      expect(await inline.answer).toBe('dropped');
      if (onDisconnect === 'continue') {
        // Its place stays taken while it runs: the user's next held run is refused.
        expect((await run(t, ann)).status).toBe(429);
        expect((await t.statusOf(id)).status).toBe('running');
        await t.call('POST', `/agents/runs/${id}/cancel`);
      }
      await until(async () => (await t.statusOf(id)).status === 'canceled', 'the run canceled');
      await until(async () => (await run(t, ann)).status === 200, 'the place given back');
    }
  });

  it('after a WebSocket closes while its run waits for a busy thread', async () => {
    const t = await startTestServer({ runs: { maxConcurrentPerUser: 1, threadBusyWaitMs: 60_000 } });
    const ann = await t.token({ user: 'ann', role: 'member' });
    const bob = await t.token({ user: 'bob', role: 'member' });
    const thread = (await t.call('POST', '/threads', {}, bob)).body.id as string;
    const holder = run(t, bob, { input: 'stall', thread_id: thread });
    await until(() => t.provider.inFlight === 1, "bob's run at the provider");

    const socket = new WebSocket(`${t.server.url.replace('http', 'ws')}/api/client/v1/ws`, {
      headers: { authorization: `Bearer ${ann}` },
    });
    afterThisTest(() => socket.terminate());
    await new Promise((resolve) => socket.once('open', resolve));
    socket.send(
      JSON.stringify({ type: 'run', request_id: 'r', agent: 'echo', input: 'x', thread_id: thread }),
    );
    await until(async () => (await run(t, ann)).status === 429, "the socket's waiting run holds ann's place");
    socket.close();
    await until(async () => (await run(t, ann)).status === 200, 'the place given back');
    await twiceLetIn(t, ann);

    await cancelRunning(t);
    await holder;
  });
});
