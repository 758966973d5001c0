import pg from 'pg';
import { ManualClock } from 'sluice/concurrency';
import { toDatabase } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { claimDue, recordFinal } from '../../src/callbacks/outbox.js';
import {
  afterThisTest,
  deferred,
  deliveries,
  endRun,
  EventLog,
  insertRun,
  openDatabase,
  postgres,
  startDispatcher,
  startReceiver,
  stopOn,
} from './helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

const leaseMs = 40_000;

describeWith({ PostgreSQL: postgres })('CallbackDispatcher: restarts, leases and concurrency', () => {
  it('a delivery cut short by stop() is delivered by the next process once the lease ends', async () => {
    const { db } = await openDatabase();
    const hold = deferred();
    const receiver = await startReceiver((_req, res) => {
      if (receiver.requests.length === 1) return hold.promise;
      res.statusCode = 200;
    });
    const clock = new ManualClock(Date.now());
    const a = startDispatcher(db, { clock, leaseMs });
    const id = await insertRun(db, { status: 'running', callbackUrl: receiver.url });
    await endRun(db, id, 'succeeded');
    a.dispatcher.start();
    await receiver.received(1);

    // A stops mid-attempt: after its stop bound it abandons the request and records nothing.
    await stopOn(a.dispatcher, clock);
    expect(a.events.count('abandoned')).toBe(1);
    expect(await deliveries(db)).toMatchObject([{ state: 'pending', attempts: 1 }]);
    expect((await deliveries(db))[0]!.lease).not.toBeNull();

    // B, a process started afterwards, leaves the row alone until A's lease ends.
    const b = startDispatcher(db, { clock, leaseMs });
    b.dispatcher.start();
    const idle = await b.events.next('idle');
    expect(idle.nextPollMs).toBe(leaseMs - 1000);
    expect(b.events.count('claimed')).toBe(0);
    clock.advance(idle.nextPollMs);
    const delivered = await b.events.next('delivered');
    expect(delivered).toMatchObject({ runId: id, attempts: 2, status: 200 });
    expect(receiver.requests).toHaveLength(2);
    expect(receiver.requests[1]!.headers['webhook-id']).toBe(receiver.requests[0]!.headers['webhook-id']);
    expect(await deliveries(db)).toMatchObject([{ state: 'delivered', attempts: 2, lease: null }]);
    hold.resolve();
  });

  it('a row claimed by a process that died is delivered after its lease, and the dead claim cannot record', async () => {
    const { db } = await openDatabase();
    const receiver = await startReceiver((_req, res) => {
      res.statusCode = 204;
    });
    const { dispatcher, clock, events } = startDispatcher(db, { leaseMs });
    const id = await insertRun(db, { status: 'running', callbackUrl: receiver.url });
    await endRun(db, id, 'canceled');
    // The claim a crashed process made: nothing will ever record its outcome.
    const [claimed] = await claimDue(db, { limit: 10, lease: 'crashed', leaseMs, now: clock.now() });
    expect(claimed).toMatchObject({ run_id: id, attempts: 1 });

    dispatcher.start();
    const idle = await events.next('idle');
    expect(idle.nextPollMs).toBe(leaseMs);
    clock.advance(leaseMs - 1);
    expect(events.count('claimed')).toBe(0);
    clock.advance(1);
    await events.next('delivered');
    expect(await deliveries(db)).toMatchObject([{ state: 'delivered', attempts: 2 }]);
    // The crashed claim's late answer changes nothing.
    expect(
      await recordFinal(db, {
        id: claimed!.id,
        lease: 'crashed',
        state: 'failed',
        status: 500,
        error: 'late',
        now: null,
      }),
    ).toBe(false);
    expect(await deliveries(db)).toMatchObject([{ state: 'delivered', last_status: 204, last_error: null }]);
  });

  it('keeps at most `concurrency` requests open while 50 deliveries are due, and delivers each once', async () => {
    const { db } = await openDatabase();
    const held: (() => void)[] = [];
    let heldChanged = () => undefined as void;
    const receiver = await startReceiver(
      () =>
        new Promise<void>((resolve) => {
          held.push(resolve);
          heldChanged();
        }),
    );
    const { dispatcher, events } = startDispatcher(db, { concurrency: 8 });
    await Promise.all(
      Array.from({ length: 50 }, async () =>
        endRun(db, await insertRun(db, { status: 'running', callbackUrl: receiver.url }), 'succeeded'),
      ),
    );
    dispatcher.start();
    let delivered = 0;
    while (delivered < 50) {
      const batch = Math.min(8, 50 - delivered);
      // Wait until the dispatcher has filled every slot, then answer them all.
      await new Promise<void>((resolve) => {
        heldChanged = () => {
          if (held.length >= batch) resolve();
        };
        heldChanged();
      });
      expect(held).toHaveLength(batch);
      // The batch's attempts, and perhaps some of the last batch's between their 'delivered'
      // and their end (a slot is filled as soon as one ends): never more than the concurrency.
      expect(dispatcher.inFlight).toBeGreaterThanOrEqual(batch);
      expect(dispatcher.inFlight).toBeLessThanOrEqual(8);
      for (const release of held.splice(0)) release();
      delivered += batch;
      await events.reached('delivered', delivered);
    }
    expect(receiver.maxOpen).toBe(8);
    expect(receiver.requests).toHaveLength(50);
    expect(new Set(receiver.requests.map((r) => r.headers['webhook-id'])).size).toBe(50);
    expect((await deliveries(db)).every((r) => r.state === 'delivered' && r.attempts === 1)).toBe(true);
  });

  it('two processes on one table deliver every row exactly once between them', async () => {
    const { db: dbA, schema } = await openDatabase();
    // Both processes fill their slots before anything is answered, so each one provably takes part.
    const gate = deferred();
    const receiver = await startReceiver(async (_req, res) => {
      await gate.promise;
      res.statusCode = 200;
    });
    // A second pool on the same schema stands in for the second process.
    const poolB = new pg.Pool({ ...postgres!, max: 3, options: `-c search_path=${schema}` });
    afterThisTest(() => poolB.end());
    const dbB = toDatabase(poolB);
    const runs = await Promise.all(
      Array.from({ length: 30 }, async () => {
        const id = await insertRun(dbA, { status: 'running', callbackUrl: receiver.url });
        await endRun(dbA, id, 'succeeded');
        return id;
      }),
    );
    const clock = new ManualClock(Date.now());
    const both = new EventLog();
    const a = startDispatcher(dbA, { clock, concurrency: 4, log: both.log });
    const b = startDispatcher(dbB, { clock, concurrency: 4, log: both.log });
    a.dispatcher.start();
    b.dispatcher.start();
    await receiver.opened(8);
    expect([a.dispatcher.inFlight, b.dispatcher.inFlight]).toEqual([4, 4]);
    gate.resolve();
    await both.reached('delivered', 30);

    expect(receiver.requests).toHaveLength(30);
    const bodies = receiver.requests.map((r) => (JSON.parse(r.body) as { id: string }).id).sort();
    expect(bodies).toEqual([...runs].sort());
    expect(a.events.count('delivered') + b.events.count('delivered')).toBe(30);
    expect((await deliveries(dbA)).every((r) => r.state === 'delivered' && r.attempts === 1)).toBe(true);
  });
});
