import { expect, it } from 'vitest';
import { TickWatch } from '../../src/triggers/tick-watch.js';
import { startTestServer } from '../helpers.js';
import { countingDatabase, type QueryCounts } from '../limits/harness.js';

// On the embedded store every trigger is made by this process, so the ticker knows the next
// tick: it sleeps until then instead of asking the database every second (each question holds
// the event loop PGlite runs on). A shared PostgreSQL store has other writers: it asks each time.

const MINUTE = 60_000;
const looks = /FROM triggers\s+WHERE schedule IS NOT NULL AND next_tick_at <=/;

it('on the embedded store the ticker looks only once a tick may have come, and a trigger made here wakes it', async () => {
  let clock = Math.floor(Date.now() / (5 * MINUTE)) * 5 * MINUTE + 10_000;
  let seen = 0;
  const counts: QueryCounts = {
    queries: 0,
    transactions: 0,
    onQuery: (text) => void (looks.test(text) && seen++),
  };
  const t = await startTestServer({
    database: 'pglite',
    now: () => clock,
    background: false,
    wrapStore: (store) => ({ ...store, db: countingDatabase(store.db, counts) }),
  });
  expect(t.server.store.solo).toBe(true);
  const { triggers } = t.server;

  // The first check knows nothing yet: it looks, and learns there is no schedule at all.
  await triggers.check();
  expect(seen).toBe(1);
  await triggers.check();
  expect(seen).toBe(1);

  const made = await t.call('POST', '/triggers', { name: 'five', agent: 'echo', schedule: '*/5 * * * *' });
  expect(made.status, JSON.stringify(made.body)).toBe(201);
  // Its first tick is about five minutes away: no look before it.
  await triggers.check();
  clock += 4 * MINUTE;
  await triggers.check();
  expect(seen).toBe(1);

  clock += MINUTE;
  expect(await triggers.check()).toBe(1);
  expect(seen).toBe(2);
  // Made: the next is five minutes on.
  expect(await triggers.check()).toBe(0);
  expect(seen).toBe(2);
});

it('a read of the next tick that a trigger made meanwhile could have missed is not trusted', () => {
  const watch = new TickWatch(true);
  expect(watch.due(0)).toBe(true);
  watch.read(watch.begin(), 1_000);
  expect([watch.due(999), watch.due(1_000)]).toEqual([false, true]);
  // A trigger made here with an earlier tick brings the look forward.
  watch.made(500);
  expect(watch.due(500)).toBe(true);
  // A trigger made while a read was under way: that read is not kept, so the next check looks.
  const begun = watch.begin();
  watch.made(2_000);
  watch.read(begun, null);
  expect(watch.due(0)).toBe(true);
});

it('on a shared store the ticker looks at every check', () => {
  const watch = new TickWatch(false);
  watch.read(watch.begin(), 10_000);
  expect(watch.due(0)).toBe(true);
});
