import { expect, it } from 'vitest';
import { tenantSigningSecret, verifyWebhook } from '../../src/callbacks/index.js';
import {
  deferred,
  deliveries,
  endRun,
  insertRun,
  openDatabase,
  postgres,
  startDispatcher,
  startReceiver,
} from './helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgres })('CallbackDispatcher: what each answer leads to', () => {
  it('delivers one signed POST per ended run, whatever ended it, and none for writes after the end', async () => {
    const { db } = await openDatabase();
    const secret = await tenantSigningSecret(db, 't');
    const receiver = await startReceiver((_req, res) => {
      res.statusCode = 204;
    });
    const { dispatcher, clock, events } = startDispatcher(db);
    const endings = [
      ['succeeded'],
      ['failed', 'expired'],
      ['failed', 'worker_lost'],
      ['failed', 'interrupted'],
      ['canceled'],
    ] as const;
    const ids: string[] = [];
    for (const [status, errorType] of endings) {
      const id = await insertRun(db, { status: 'running', callbackUrl: `${receiver.url}/hook` });
      await endRun(db, id, status, errorType);
      ids.push(id);
    }
    dispatcher.start();
    await events.reached('delivered', endings.length);

    expect(receiver.requests).toHaveLength(endings.length);
    const rows = await deliveries(db);
    for (const request of receiver.requests) {
      expect(request.method).toBe('POST');
      expect(request.url).toBe('/hook');
      expect(request.headers['content-type']).toBe('application/json');
      expect(request.headers['user-agent']).toBe('sluice');
      expect(verifyWebhook(secret, request.headers, request.body, { now: clock.now() })).toMatchObject({
        ok: true,
      });
      const body = JSON.parse(request.body) as { id: string; status: string; error: { type: string } | null };
      const i = ids.indexOf(body.id);
      expect(i).toBeGreaterThanOrEqual(0);
      expect(body.status).toBe(endings[i]![0]);
      expect(body.error?.type).toBe(endings[i]![1]);
      // webhook-id is the delivery's id, one per run.
      expect(rows.find((r) => r.run_id === body.id)!.id).toBe(request.headers['webhook-id']);
    }
    expect(new Set(receiver.requests.map((r) => r.headers['webhook-id'])).size).toBe(endings.length);
    expect(rows.map((r) => [r.state, r.attempts, r.last_status, r.lease])).toEqual(
      endings.map(() => ['delivered', 1, 204, null]),
    );

    // Ended runs written twice more: no second delivery, even when the dispatcher looks again.
    for (const id of ids) {
      await endRun(db, id, 'succeeded');
      await db.query(`UPDATE agent_runs SET metadata = '{"again": true}'::jsonb WHERE id = $1::text`, [id]);
    }
    const mark = events.events.length;
    dispatcher.notify();
    await events.next('idle', mark);
    expect(receiver.requests).toHaveLength(endings.length);
    expect((await deliveries(db)).length).toBe(endings.length);
  });

  it('retries 503 with backoff on the injected clock: three attempts, one delivery, the same webhook-id', async () => {
    const { db } = await openDatabase();
    const secret = await tenantSigningSecret(db, 't');
    const receiver = await startReceiver((_req, res) => {
      res.statusCode = receiver.requests.length <= 2 ? 503 : 200;
    });
    const { dispatcher, clock, events } = startDispatcher(db);
    const id = await insertRun(db, { status: 'running', callbackUrl: receiver.url });
    await endRun(db, id, 'succeeded');
    dispatcher.start();

    const first = await events.next('retry');
    expect(first).toMatchObject({ attempts: 1, status: 503, reason: 'HTTP 503', delayMs: 5000 });
    const idle1 = await events.next('idle', events.after(first));
    expect(idle1.nextPollMs).toBe(5000);
    expect((await deliveries(db))[0]).toMatchObject({ state: 'pending', attempts: 1, last_status: 503 });
    // Not a millisecond early: the one timer is the poll at the due time.
    clock.advance(4999);
    expect(clock.pendingTimers).toBe(1);
    expect(receiver.requests).toHaveLength(1);
    clock.advance(1);

    const second = await events.next('retry', events.after(idle1));
    expect(second).toMatchObject({ attempts: 2, status: 503, delayMs: 10_000 });
    const idle2 = await events.next('idle', events.after(second));
    expect(idle2.nextPollMs).toBe(10_000);
    clock.advance(10_000);

    await events.next('delivered');
    expect(await deliveries(db)).toMatchObject([
      { state: 'delivered', attempts: 3, last_status: 200, last_error: null },
    ]);
    expect(receiver.requests).toHaveLength(3);
    const webhookIds = new Set(receiver.requests.map((r) => r.headers['webhook-id']));
    expect(webhookIds.size).toBe(1);
    // A fresh timestamp (and so signature) per attempt, each valid when sent.
    const stamps = receiver.requests.map((r) => Number(r.headers['webhook-timestamp']));
    expect(stamps[1]! - stamps[0]!).toBe(5);
    expect(stamps[2]! - stamps[1]!).toBe(10);
    for (const [i, request] of receiver.requests.entries()) {
      const sentAt = stamps[i]! * 1000;
      expect(verifyWebhook(secret, request.headers, request.body, { now: sentAt }).ok).toBe(true);
    }
  });

  it('does not retry 400 or 410', async () => {
    const { db } = await openDatabase();
    const receiver = await startReceiver((req, res) => {
      res.statusCode = Number(req.url.slice(1));
    });
    const { dispatcher, clock, events } = startDispatcher(db);
    for (const code of [400, 410]) {
      await endRun(
        db,
        await insertRun(db, { status: 'running', callbackUrl: `${receiver.url}/${code}` }),
        'succeeded',
      );
    }
    dispatcher.start();
    await events.reached('failed', 2);
    const rows = await deliveries(db);
    expect(rows.map((r) => [r.state, r.attempts, r.last_status, r.last_error]).sort()).toEqual([
      ['failed', 1, 400, 'HTTP 400: not retried'],
      ['failed', 1, 410, 'HTTP 410: not retried'],
    ]);
    // Hours later, with a look at the table: nothing more is sent.
    clock.advance(2 * 3_600_000);
    const mark = events.events.length;
    dispatcher.notify();
    await events.next('idle', mark);
    expect(receiver.requests).toHaveLength(2);
    expect(events.count('retry')).toBe(0);
  });

  it('does not follow a 307 redirect to another loopback port', async () => {
    const { db } = await openDatabase();
    const inner = await startReceiver(() => undefined);
    const outer = await startReceiver((_req, res) => {
      res.writeHead(307, { location: `${inner.url}/redirected` });
    });
    const { dispatcher, events } = startDispatcher(db);
    await endRun(db, await insertRun(db, { status: 'running', callbackUrl: outer.url }), 'succeeded');
    dispatcher.start();
    const failed = await events.next('failed');
    expect(failed).toMatchObject({
      status: 307,
      reason: 'HTTP 307: redirects are not followed',
      attempts: 1,
    });
    expect(outer.requests).toHaveLength(1);
    expect(inner.requests).toHaveLength(0);
    expect(await deliveries(db)).toMatchObject([{ state: 'failed', last_status: 307 }]);
  });

  it('honours Retry-After on 429, and retries a network error', async () => {
    const { db } = await openDatabase();
    const receiver = await startReceiver((_req, res) => {
      res.writeHead(429, { 'retry-after': '120' });
    });
    const { dispatcher, events } = startDispatcher(db);
    await endRun(db, await insertRun(db, { status: 'running', callbackUrl: receiver.url }), 'succeeded');
    // A port that refuses connections: nothing listens on port 9 of loopback here.
    await endRun(
      db,
      await insertRun(db, { status: 'running', callbackUrl: 'http://127.0.0.1:9/' }),
      'succeeded',
    );
    dispatcher.start();
    await events.reached('retry', 2);
    const retries = events.events.filter((e) => e.type === 'retry');
    expect(retries.find((e) => e.status === 429)).toMatchObject({ delayMs: 120_000 });
    expect(retries.find((e) => e.status === null)).toMatchObject({
      reason: 'network error: ECONNREFUSED',
      delayMs: 5000,
    });
  });

  it('gives a held request up at the attempt timeout and retries it', async () => {
    const { db } = await openDatabase();
    const release = deferred();
    const receiver = await startReceiver(() => release.promise);
    const { dispatcher, clock, events } = startDispatcher(db, { attemptTimeoutMs: 10_000 });
    await endRun(db, await insertRun(db, { status: 'running', callbackUrl: receiver.url }), 'succeeded');
    dispatcher.start();
    await receiver.received(1);
    clock.advance(9_999);
    expect(events.count('retry')).toBe(0);
    clock.advance(1);
    const retry = await events.next('retry');
    expect(retry).toMatchObject({ reason: 'no response within 10000 ms', status: null, attempts: 1 });
    release.resolve();
  });

  it('ends a delivery dead once retrying would pass the maximum age', async () => {
    const { db } = await openDatabase();
    const receiver = await startReceiver((_req, res) => {
      res.statusCode = 500;
    });
    const { dispatcher, clock, events } = startDispatcher(db, { maxAgeMs: 20_000 });
    await endRun(db, await insertRun(db, { status: 'running', callbackUrl: receiver.url }), 'succeeded');
    dispatcher.start();
    // Attempts at 0 s, 5 s and 15 s; the next would be at 35 s, past 20 s.
    for (const delay of [5000, 10_000]) {
      const retry = await events.next('retry', events.events.length);
      expect(retry.delayMs).toBe(delay);
      await events.next('idle', events.after(retry));
      clock.advance(delay);
    }
    const dead = await events.next('dead');
    expect(dead).toMatchObject({ attempts: 3, status: 500 });
    expect(await deliveries(db)).toMatchObject([
      { state: 'dead', attempts: 3, last_status: 500, lease: null },
    ]);
    expect(receiver.requests).toHaveLength(3);
  });

  it('fails a delivery whose run is gone, and retries when rendering fails on our side', async () => {
    const { db } = await openDatabase();
    const receiver = await startReceiver(() => undefined);
    const gone = await insertRun(db, { status: 'running', callbackUrl: receiver.url });
    const broken = await insertRun(db, { status: 'running', callbackUrl: receiver.url });
    const { dispatcher, events } = startDispatcher(db, {
      renderRun: async (id) => {
        if (id === broken) throw new Error('database unavailable');
        return undefined;
      },
    });
    await endRun(db, gone, 'succeeded');
    await endRun(db, broken, 'succeeded');
    dispatcher.start();
    await Promise.all([events.next('failed'), events.next('retry')]);
    expect(events.events.find((e) => e.type === 'failed')).toMatchObject({
      runId: gone,
      reason: 'the run no longer exists',
    });
    expect(events.events.find((e) => e.type === 'retry')).toMatchObject({
      runId: broken,
      reason: 'internal: database unavailable',
    });
    expect(receiver.requests).toHaveLength(0);
  });
});
