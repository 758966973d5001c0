import { ManualClock } from 'sluice/concurrency';
import type { Database } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { CallbackDispatcher } from '../../src/callbacks/dispatcher.js';
import { describeWith } from '../../../../scripts/service-suites.js';
import {
  afterThisTest,
  deliveries,
  endRun,
  EventLog,
  insertRun,
  openDatabase,
  postgres,
  renderFrom,
  startReceiver,
  stopOn,
  testStopTimeoutMs,
} from './helpers.js';

/** The same database, whose next outbox poll fails once `fail()` is called (the database away). */
function failingPoll(db: Database): { db: Database; fail(): void } {
  let failing = false;
  return {
    fail: () => (failing = true),
    db: {
      query: (text, params) => {
        if (failing && /^\s*WITH due AS \(\s*SELECT id FROM callback_deliveries/.test(text)) {
          failing = false;
          return Promise.reject(new Error('injected: the outbox poll failed'));
        }
        return db.query(text, params);
      },
      transaction: (body, options) => db.transaction(body, options),
    },
  };
}

/** A dispatcher on a ManualClock over that database, stopped after the test; its events logged. */
function faultyDispatcher(db: Database, pollIntervalMs: number) {
  const faulty = failingPoll(db);
  const clock = new ManualClock(Date.now());
  const events = new EventLog();
  const dispatcher = new CallbackDispatcher({
    db: faulty.db,
    renderRun: renderFrom(db),
    allowPrivate: true,
    pollIntervalMs,
    stopTimeoutMs: testStopTimeoutMs,
    random: () => 1,
    log: events.log,
    clock,
  });
  afterThisTest(() => stopOn(dispatcher, clock), 'the dispatcher');
  return { fail: faulty.fail, clock, events, dispatcher };
}

describeWith({ PostgreSQL: postgres })('CallbackDispatcher: a poll that failed', () => {
  // The embedded store polls the outbox every 10 s (no other process adds rows to it); a poll
  // that failed is no fallback: the delivery it was for is tried again at the shared pace.
  it('is tried again after pollRetryMs, not after a long pollIntervalMs, and the delivery goes out', async () => {
    const { db } = await openDatabase();
    const receiver = await startReceiver((_req, res) => {
      res.statusCode = 200;
    });
    const { fail, clock, events, dispatcher } = faultyDispatcher(db, 10_000);
    const id = await insertRun(db, { status: 'running', callbackUrl: receiver.url });
    await endRun(db, id, 'succeeded');
    fail();
    dispatcher.start();

    const failed = await events.next('error');
    expect(failed).toMatchObject({ during: 'poll' });
    const idle = await events.next('idle', events.after(failed));
    expect(idle.nextPollMs).toBe(1000);
    expect(receiver.requests).toHaveLength(0);
    clock.advance(1000);
    await events.next('delivered');
    expect(await deliveries(db)).toMatchObject([{ state: 'delivered', attempts: 1 }]);
  });

  it('never waits longer than pollIntervalMs after a failure, when that is the shorter', async () => {
    const { db } = await openDatabase();
    const { fail, events, dispatcher } = faultyDispatcher(db, 200);
    fail();
    dispatcher.start();
    const failed = await events.next('error');
    expect((await events.next('idle', events.after(failed))).nextPollMs).toBe(200);
  });
});
