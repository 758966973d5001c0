import { createHmac, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { beforeAll, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import type { ServerSettings } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';
import { tenantSigningSecret } from '../../src/callbacks/index.js';
import {
  afterThisFile,
  freshDatabase,
  lastUserText,
  ownStandIn,
  postgres,
  startTestServer,
  until,
  type TestServer,
} from '../helpers.js';

/**
 * Every way a run can end, each reaching a real receiver on 127.0.0.1 exactly once, signed with
 * the tenant's secret (checked here by hand, not with the server's own verifier). Three server
 * processes share one PostgreSQL database: `main` does most of the work, `lost` stops its upkeep
 * (no heartbeat: a frozen process) so its run ends worker_lost, and `leaving` drains with a run
 * still going, which ends interrupted.
 */

type Kind =
  'succeeded' | 'failed' | 'canceled_queued' | 'canceled_running' | 'expired' | 'worker_lost' | 'interrupted';

const shared: Partial<ServerSettings> = {
  callbackAllowPrivate: true,
  // One deferred run at a time per tenant: a second one waits, and expires after 300 ms.
  deferredMaxRunningPerTenant: 1,
  deferredMaxWaitMs: 300,
  // A silent process is declared lost after 3 s (heartbeats every 750 ms): quick enough for a
  // test, slow enough that a busy machine does not lose a healthy process.
  nodeStaleMs: 3_000,
};

let hookUrl: string;
const received: { headers: IncomingHttpHeaders; body: string }[] = [];
const procs: Record<'main' | 'lost' | 'leaving', TestServer> = {} as never;

describeWith({ PostgreSQL: postgres })(
  'callbacks of every terminal state, from three processes on one database',
  () => {
    beforeAll(async () => {
      const databaseUrl = await freshDatabase();

      const receiver = createServer((req, res) => {
        const chunks: Buffer[] = [];
        req.on('data', (d: Buffer) => chunks.push(d));
        req.on('end', () => {
          received.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
          res.writeHead(204).end();
        });
      });
      await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
      afterThisFile(() => new Promise<void>((r) => receiver.close(() => r())), 'the callback receiver');
      hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;

      const provider = ownStandIn(
        await startProviderStandIn({
          reply: (r) => {
            const last = lastUserText(r);
            if (last.includes('stall')) return { stall: true };
            if (last.includes('fail')) return { status: 400, message: 'the model refused' };
            return { text: `done ${last}`, usage: { input: 1, output: 1 } };
          },
        }),
      );
      for (const [name, extra] of [
        ['main', {}],
        ['lost', {}],
        ['leaving', { drainTimeoutMs: 100 }],
      ] as const) {
        const t = await startTestServer({ databaseUrl, provider, settings: { ...shared, ...extra } });
        // Only `main` claims queued runs: the others execute their own held runs, so which process
        // takes the deferred holder is not left to a race (`leaving` would drain it as interrupted).
        if (name !== 'main') await t.server.executor.stopWorkers();
        procs[name] = t;
      }
    });

    const call = (on: keyof typeof procs, method: string, path: string, body?: unknown) =>
      procs[on].call(method, path, body, procs.main.admin);

    /** A held run whose answer the test does not wait for (it ends in a way the test brings about). */
    function holdRun(on: keyof typeof procs, input: string) {
      const answer = call(on, 'POST', '/agents/echo/runs', { input, callback_url: hookUrl });
      void answer.catch(() => undefined);
      return answer;
    }

    const runIdAt = async (input: string) => {
      let id: string | undefined;
      await until(async () => {
        const rows = await procs.main.server.store.db.query<{ id: string }>(
          `SELECT id FROM agent_runs WHERE input = to_jsonb($1::text) AND status = 'running'`,
          [input],
        );
        id = rows.rows[0]?.id;
        return id !== undefined;
      }, `run "${input}" running`);
      return id!;
    };

    /** Standard Webhooks, checked from its definition: HMAC-SHA256 of id.timestamp.body, base64, keyed with the secret's bytes. */
    function signedBy(secret: string, headers: IncomingHttpHeaders, body: string): boolean {
      const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
      const expected = createHmac('sha256', key)
        .update(`${String(headers['webhook-id'])}.${String(headers['webhook-timestamp'])}.${body}`)
        .digest();
      return String(headers['webhook-signature'])
        .split(' ')
        .some((s) => {
          const given = Buffer.from(s.replace(/^v1,/, ''), 'base64');
          return s.startsWith('v1,') && given.length === expected.length && timingSafeEqual(given, expected);
        });
    }

    it('one signed delivery per terminal state: succeeded, failed, canceled, expired, worker_lost, interrupted', async () => {
      const ids = {} as Record<Kind, string>;

      ids.succeeded = (
        await call('main', 'POST', '/agents/echo/runs', { input: 'hello', callback_url: hookUrl })
      ).body.id;
      ids.failed = (
        await call('main', 'POST', '/agents/echo/runs', { input: 'fail please', callback_url: hookUrl })
      ).body.id;

      ids.canceled_queued = (
        await call('main', 'POST', '/agents/echo/runs', {
          input: 'later',
          delay_seconds: 3600,
          callback_url: hookUrl,
        })
      ).body.id;
      expect((await call('main', 'POST', `/agents/runs/${ids.canceled_queued}/cancel`)).body.status).toBe(
        'canceled',
      );

      void holdRun('main', 'stall then cancel');
      ids.canceled_running = await runIdAt('stall then cancel');
      await call('main', 'POST', `/agents/runs/${ids.canceled_running}/cancel`);

      // A deferred run holds the tenant's one deferred slot, so the next one waits and expires.
      const holder = (
        await call('main', 'POST', '/agents/echo/runs', { input: 'stall holder', class: 'deferred' })
      ).body.id;
      ids.expired = (
        await call('main', 'POST', '/agents/echo/runs', {
          input: 'too late',
          class: 'deferred',
          callback_url: hookUrl,
        })
      ).body.id;

      // `lost` stops beating while its run is at the provider: a peer declares the run worker_lost.
      void holdRun('lost', 'stall until lost');
      ids.worker_lost = await runIdAt('stall until lost');
      procs.lost.server.upkeep.stop();

      // `leaving` drains with its run still at the provider: the run ends interrupted.
      const leavingAnswer = holdRun('leaving', 'stall until drained');
      ids.interrupted = await runIdAt('stall until drained');
      expect(await procs.leaving.server.drain()).toEqual([ids.interrupted]);
      expect((await leavingAnswer).status).toBe(503);

      await until(() => received.length >= 7, 'seven deliveries');
      await call('main', 'POST', `/agents/runs/${holder}/cancel`);

      const secret = await tenantSigningSecret(procs.main.server.store.db, 't');
      const byRun = new Map<string, { status: string; error: { type: string } | null }>();
      const messageIds = new Set<string>();
      for (const delivery of received) {
        expect(signedBy(secret, delivery.headers, delivery.body), delivery.body.slice(0, 80)).toBe(true);
        expect(Math.abs(Number(delivery.headers['webhook-timestamp']) - Date.now() / 1000)).toBeLessThan(300);
        messageIds.add(String(delivery.headers['webhook-id']));
        const run = JSON.parse(delivery.body) as {
          id: string;
          status: string;
          error: { type: string } | null;
        };
        expect(byRun.has(run.id), `a second delivery for ${run.id}`).toBe(false);
        byRun.set(run.id, run);
      }
      expect(messageIds.size).toBe(received.length);
      const seen = (kind: Kind) => {
        const run = byRun.get(ids[kind]);
        return run && [run.status, run.error?.type ?? null];
      };
      expect(Object.fromEntries((Object.keys(ids) as Kind[]).map((k) => [k, seen(k)]))).toEqual({
        succeeded: ['succeeded', null],
        failed: ['failed', 'agent_error'],
        canceled_queued: ['canceled', null],
        canceled_running: ['canceled', null],
        expired: ['failed', 'expired'],
        worker_lost: ['failed', 'worker_lost'],
        interrupted: ['failed', 'interrupted'],
      });
      expect(received.length).toBe(7);

      // Every row of the outbox is delivered, on its first attempt: no copy is still to come.
      const outbox = await procs.main.server.store.db.query<{
        run_id: string;
        state: string;
        attempts: number;
        id: string;
      }>('SELECT run_id, state, attempts, id FROM callback_deliveries ORDER BY run_id');
      expect(outbox.rows.map((r) => [r.state, r.attempts])).toEqual(Array(7).fill(['delivered', 1]));
      expect(new Set(outbox.rows.map((r) => r.id))).toEqual(messageIds);
    });
  },
);
