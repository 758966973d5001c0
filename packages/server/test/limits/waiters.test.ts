import { expect, it } from 'vitest';
import { until } from '../helpers.js';
import { startCountedApp } from './harness.js';

/** The deferred queue held: one deferred run may run per tenant, and one stalls. */
// A hundred callers of one user wait at once here: the per-user cap of held callers is off.
const held = {
  deferredMaxRunningPerTenant: 1,
  deferredConcurrency: 1,
  runConcurrency: 1,
  maxConcurrentPerUser: 0,
};

it('H5: a deferred run is answered 202 at once unless the caller sends wait: true', async () => {
  const { app, provider, token, call } = await startCountedApp(held);
  const member = await token();
  const stalled = await call('POST', '/agents/echo/runs', member, { input: 'stall', class: 'deferred' });
  expect(stalled.status).toBe(202);
  await until(() => provider.inFlight === 1, 'the deferred run reaches the model');

  // The queue is held for as long as the stalled run lasts: answered at all means answered at once.
  const later = await call('POST', '/agents/echo/runs', member, { input: 'later', class: 'deferred' });
  expect(later.status).toBe(202);
  expect(later.body).toMatchObject({ status: 'queued', class: 'deferred' });
  expect(app.waiters.size).toBe(0);

  let answered = false;
  const patient = call('POST', '/agents/echo/runs', member, {
    input: 'patient',
    class: 'deferred',
    wait: true,
  }).finally(() => (answered = true));
  await until(() => app.waiters.size === 1, 'the waiting caller is held');
  expect(answered).toBe(false);

  // The queue moves: the waiting caller gets its run's end.
  expect((await call('POST', `/agents/runs/${stalled.body.id}/cancel`, member)).body.status).toBe('canceled');
  const done = await patient;
  expect(done.status).toBe(200);
  expect(done.body).toMatchObject({ status: 'succeeded', output: { text: 'done patient' } });
  expect(app.waiters.size).toBe(0);
}, 60_000);

it('H5 and item 4: callers waiting on queued deferred runs cost no query per poll (10 vs 100 waiters), and a client that disconnects leaves', async () => {
  const { app, url, provider, token, counts, call } = await startCountedApp(held);
  const member = await token();
  const stalled = await call('POST', '/agents/echo/runs', member, { input: 'stall', class: 'deferred' });
  await until(() => provider.inFlight === 1, 'the deferred run reaches the model');

  // The waiters' shared look: which runs ended, among all those waited on.
  const looks: unknown[][] = [];
  counts.onQuery = (text, params) => {
    if (/status IN \('succeeded', 'failed', 'canceled'\)/.test(text)) looks.push(params?.[0] as unknown[]);
  };
  const clients: AbortController[] = [];
  const wait = async (n: number) => {
    for (let i = clients.length; i < n; i++) {
      const client = new AbortController();
      clients.push(client);
      void fetch(`${url}/api/client/v1/agents/echo/runs`, {
        method: 'POST',
        signal: client.signal,
        headers: { authorization: `Bearer ${member}`, 'content-type': 'application/json' },
        body: JSON.stringify({ input: `waiting ${i}`, class: 'deferred', wait: true }),
      }).catch(() => undefined);
    }
    await until(() => app.waiters.size === n, `${n} callers waiting`);
  };
  /** Statements per second between two of the waiters' looks, and what the second look asked about. */
  const rate = async () => {
    const seen = looks.length;
    await until(() => looks.length > seen, 'a look of the waiters');
    counts.queries = 0;
    counts.transactions = 0;
    const from = Date.now();
    await until(() => looks.length > seen + 1, 'the next look of the waiters');
    const seconds = (Date.now() - from) / 1000;
    return { perSecond: (counts.queries + counts.transactions) / seconds, ids: looks.at(-1)!.length };
  };

  await wait(10);
  const ten = await rate();
  await wait(100);
  const hundred = await rate();
  // One look asks about every waited run at once.
  expect(ten.ids).toBe(10);
  expect(hundred.ids).toBe(100);
  // Ninety more waiters add less than a tenth of a statement per second each; a poll per waiter
  // (even one a second) would add 90 a second.
  expect(hundred.perSecond).toBeLessThan(ten.perSecond + 9);

  for (const client of clients) client.abort();
  await until(() => app.waiters.size === 0, 'the waiters of gone clients leave');
  // Their runs are not canceled by it: they stay queued behind the stalled one.
  const queue = await call('GET', '/agents/runs/queue', member);
  expect(queue.body.deferred).toMatchObject({ running: 1, queued: 100 });
  expect(stalled.status).toBe(202);
}, 120_000);
