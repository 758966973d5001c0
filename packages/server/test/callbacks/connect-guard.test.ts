import { expect, it } from 'vitest';
import { checkCallbackUrl, type Resolver } from '../../src/callbacks/index.js';
import {
  deliveries,
  endRun,
  insertRun,
  openDatabase,
  postgres,
  startDispatcher,
  startReceiver,
} from './helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

const answers =
  (table: Record<string, string[]>): Resolver =>
  async (host) =>
    (table[host] ?? []).map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));

describeWith({ PostgreSQL: postgres })(
  'CallbackDispatcher: the destination is judged again when connecting',
  () => {
    it('DNS rebinding: a name public at creation and loopback at connect time never reaches the receiver', async () => {
      const { db } = await openDatabase();
      const receiver = await startReceiver(() => undefined);
      const url = `http://rebind.test:${receiver.port}/hook`;
      // At run creation the name looks public, so the run is accepted...
      expect(
        await checkCallbackUrl(url, {
          allowPrivate: false,
          lookup: answers({ 'rebind.test': ['93.184.215.14'] }),
        }),
      ).toEqual({ ok: true, url });
      // ...and by delivery time it points at loopback, alone or among public addresses.
      const { dispatcher, events } = startDispatcher(db, {
        allowPrivate: false,
        lookup: answers({ 'rebind.test': ['127.0.0.1'], 'mixed.test': ['93.184.215.14', '::1'] }),
      });
      const rebound = await insertRun(db, { status: 'running', callbackUrl: url });
      const mixed = await insertRun(db, {
        status: 'running',
        callbackUrl: `http://mixed.test:${receiver.port}/hook`,
      });
      // https goes through the same lookup (it runs before any TLS).
      const secure = await insertRun(db, {
        status: 'running',
        callbackUrl: `https://rebind.test:${receiver.port}/hook`,
      });
      await endRun(db, rebound, 'succeeded');
      await endRun(db, mixed, 'succeeded');
      await endRun(db, secure, 'succeeded');
      dispatcher.start();
      await events.reached('failed', 3);

      expect(receiver.requests).toHaveLength(0);
      const reasons = Object.fromEntries(
        events.events.flatMap((e) => (e.type === 'failed' ? [[e.runId, e.reason]] : [])),
      );
      expect(reasons[rebound]).toBe(
        'callback_url refused at connect time: rebind.test resolved to 127.0.0.1, a loopback address',
      );
      expect(reasons[secure]).toBe(reasons[rebound]);
      expect(reasons[mixed]).toBe(
        'callback_url refused at connect time: mixed.test resolved to ::1, a loopback address',
      );
      // Not retried: a destination that resolves inside the network is refused, not unlucky.
      expect((await deliveries(db)).map((r) => [r.state, r.attempts])).toEqual([
        ['failed', 1],
        ['failed', 1],
        ['failed', 1],
      ]);
    });

    it('refuses a forbidden literal address stored before the creation check existed, without connecting', async () => {
      const { db } = await openDatabase();
      const receiver = await startReceiver(() => undefined);
      const { dispatcher, events } = startDispatcher(db, { allowPrivate: false });
      for (const host of ['127.0.0.1', '[::ffff:127.0.0.1]', '2130706433', 'localhost']) {
        await endRun(
          db,
          await insertRun(db, { status: 'running', callbackUrl: `http://${host}:${receiver.port}/` }),
          'succeeded',
        );
      }
      dispatcher.start();
      await events.reached('failed', 4);
      expect(receiver.requests).toHaveLength(0);
      for (const event of events.events) {
        if (event.type === 'failed')
          expect(event.reason).toMatch(
            /^Expected `callback_url` to (reach a public address|name a public host)/,
          );
      }
    });

    it('with allowPrivate, a name that resolves to loopback is delivered, through the lookup it was given', async () => {
      const { db } = await openDatabase();
      const receiver = await startReceiver((_req, res) => {
        res.statusCode = 200;
      });
      const looked: string[] = [];
      const { dispatcher, events } = startDispatcher(db, {
        allowPrivate: true,
        lookup: async (host) => {
          looked.push(host);
          return [{ address: '127.0.0.1', family: 4 }];
        },
      });
      const url = `http://callbacks.test:${receiver.port}/in`;
      expect(await checkCallbackUrl(url, { allowPrivate: true })).toEqual({ ok: true, url });
      await endRun(db, await insertRun(db, { status: 'running', callbackUrl: url }), 'succeeded');
      dispatcher.start();
      await events.next('delivered');
      expect(looked).toEqual(['callbacks.test']);
      expect(receiver.requests).toHaveLength(1);
      expect(receiver.requests[0]!.headers.host).toBe(`callbacks.test:${receiver.port}`);
    });
  },
);
