import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import type { RunningServer } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';
import { freshDatabase, ownStandIn, postgres, startTestServer, until, type TestServer } from '../helpers.js';
import { sendWebhook, standardHeaders } from './harness.js';

/**
 * Two server processes (two apps, each with its own pool, node id, upkeep loop and executor) on
 * one PostgreSQL database, with one clock the test moves: each schedule tick makes one run
 * whichever process sees it first, missed ticks after downtime make one run, and copies of one
 * webhook delivery sent to both make one run.
 */

const MINUTE = 60_000;
let clock = Date.now();
const now = () => clock;

const servers: TestServer[] = [];
const apps: RunningServer[] = [];
let db: pg.Client;
let admin: string;

describeWith({ PostgreSQL: postgres })('schedules and webhooks across two processes on one database', () => {
  beforeAll(async () => {
    const databaseUrl = await freshDatabase();
    const provider = ownStandIn(
      await startProviderStandIn({ reply: () => ({ text: 'ok', usage: { input: 1, output: 1 } }) }),
    );
    for (let i = 0; i < 2; i++) {
      // Started by hand in the second test: their upkeep loops are part of what is tested.
      const t = await startTestServer({
        databaseUrl,
        provider,
        // r: copies of one delivery racing for the tenant's last place.
        tenants: { q: { runs: { limit: 1, per: 'hour' } }, r: { runs: { limit: 1, per: 'hour' } } },
        now,
        background: false,
      });
      servers.push(t);
      apps.push(t.server);
    }
    db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    admin = servers[0]!.admin;
  });

  afterAll(async () => {
    await db?.end();
  });

  const call = (method: string, path: string, body?: unknown, token = admin) =>
    servers[0]!.call(method, path, body, token);

  const runsOf = async (triggerId: string) =>
    (
      await db.query<{ id: string; scheduled_for: string; class: string }>(
        `SELECT id, metadata ->> 'scheduled_for' AS scheduled_for, class FROM agent_runs
       WHERE metadata ->> 'trigger_id' = $1 ORDER BY created_at`,
        [triggerId],
      )
    ).rows;

  /** Both processes look for ticks at the same moment; returns the runs each made. */
  const bothTick = () => Promise.all(apps.map((app) => app.triggers.tickNow()));

  /** The first multiple of `stepMs` after `ms`. */
  const nextBoundary = (ms: number, stepMs: number) => Math.floor(ms / stepMs) * stepMs + stepMs;

  it('makes one run per tick across two processes, skips ticks before the trigger, and catches up once', async () => {
    clock = Date.now();
    const created = await call('POST', '/triggers', {
      name: 'every five minutes',
      agent: 'echo',
      class: 'deferred',
      schedule: '*/5 * * * *',
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body.schedule).toBe('*/5 * * * *');
    const id = created.body.id as string;

    // The tick before the trigger was made is not its tick.
    expect(await bothTick()).toEqual([0, 0]);

    const first = nextBoundary(Date.now(), 5 * MINUTE);
    clock = first;
    const made = await bothTick();
    expect(made.reduce((a, b) => a + b)).toBe(1);
    // Later looks within the same five minutes find nothing new, on either process.
    clock = first + 4 * MINUTE;
    expect(await bothTick()).toEqual([0, 0]);

    for (let i = 1; i <= 3; i++) {
      clock = first + i * 5 * MINUTE;
      // Several looks at once on each process, as slow upkeep passes could overlap with a peer's.
      const counts = await Promise.all([bothTick(), bothTick()]);
      expect(counts.flat().reduce((a, b) => a + b)).toBe(1);
    }
    expect((await runsOf(id)).length).toBe(4);

    // Down for an hour: twelve ticks were missed, and one run is made, for the latest of them.
    const latest = first + 3 * 5 * MINUTE + 60 * MINUTE;
    clock = latest + 2 * MINUTE;
    expect((await bothTick()).reduce((a, b) => a + b)).toBe(1);
    const runs = await runsOf(id);
    expect(runs.length).toBe(5);
    expect(runs.at(-1)!.scheduled_for).toBe(new Date(latest).toISOString());
    expect(new Set(runs.map((r) => r.class))).toEqual(new Set(['deferred']));
    // One tick row per run, keyed by the tick.
    const ticks = await db.query('SELECT count(*)::int AS n FROM trigger_ticks WHERE trigger_id = $1', [id]);
    expect(ticks.rows[0].n).toBe(5);

    // A deleted trigger ticks no more.
    expect((await call('DELETE', `/triggers/${id}`)).status).toBe(200);
    clock = latest + 10 * MINUTE;
    expect(await bothTick()).toEqual([0, 0]);
    // Its runs stay (they are the tenant's runs); no sixth one was made.
    expect((await runsOf(id)).length).toBe(5);
  });

  it("the processes' own upkeep loops make the tick, once", async () => {
    clock = Date.now();
    const created = await call('POST', '/triggers', { name: 'hourly', agent: 'echo', schedule: '@hourly' });
    expect(created.status).toBe(201);
    const id = created.body.id as string;
    for (const app of apps) await app.start();
    clock = nextBoundary(Date.now(), 60 * MINUTE) + 1_000;
    await until(async () => (await runsOf(id)).length > 0, 'a run of the hourly tick');
    // Whichever loop made it, the other finds it made: a look by each now adds nothing.
    expect(await bothTick()).toEqual([0, 0]);
    const runs = await runsOf(id);
    expect(runs.length).toBe(1);
    // The default-class run is executed by the workers like any queued run.
    await until(async () => {
      const r = await db.query('SELECT status FROM agent_runs WHERE id = $1', [runs[0]!.id]);
      return r.rows[0]?.status === 'succeeded';
    }, 'the tick run to succeed');
  });

  it('a tick refused by a cap is recorded, not retried on every look', async () => {
    clock = Date.now();
    const qAdmin = await servers[0]!.token({ tenant: 'q' });
    const created = await call(
      'POST',
      '/triggers',
      { name: 'capped', agent: 'echo', schedule: '* * * * *' },
      qAdmin,
    );
    const id = created.body.id as string;
    // The upkeep loops run from here on (the test before started them): they may look first, so
    // what is counted is the runs and ticks, not which look made them.
    const minute = nextBoundary(Date.now(), MINUTE);
    clock = minute;
    await bothTick();
    expect((await runsOf(id)).length).toBe(1);
    clock = minute + MINUTE;
    await bothTick();
    const refused = await db.query(
      'SELECT refused, run_id FROM trigger_ticks WHERE trigger_id = $1 ORDER BY tick',
      [id],
    );
    expect(refused.rows).toEqual([
      { refused: null, run_id: (await runsOf(id))[0]!.id },
      { refused: 'agent_quota_exceeded', run_id: null },
    ]);
    expect(await bothTick()).toEqual([0, 0]);
    expect((await runsOf(id)).length).toBe(1);
  });

  it('copies of one webhook delivery sent to both processes at once make one run', async () => {
    const created = await call('POST', '/triggers', { name: 'hook', agent: 'echo', class: 'deferred' });
    const { id, secret } = created.body as { id: string; secret: string };
    const body = '{"event":"push"}';
    clock = Date.now();
    const headers = standardHeaders(secret, 'msg_two_processes', body, Math.floor(clock / 1000));
    const answers = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        sendWebhook(`${apps[i % 2]!.url}/api/client/v1/triggers/${id}/webhook`, body, headers),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(Array(10).fill(202));
    expect(new Set(answers.map((a) => a.body.id)).size).toBe(1);
    const runs = await db.query(`SELECT id FROM agent_runs WHERE metadata ->> 'trigger_id' = $1`, [id]);
    expect(runs.rows.length).toBe(1);
  });

  it('copies of one delivery racing for the last place under a cap all get 202 with its run, not 429', async () => {
    const rAdmin = await servers[0]!.token({ tenant: 'r' });
    const created = await call(
      'POST',
      '/triggers',
      { name: 'last', agent: 'echo', class: 'deferred' },
      rAdmin,
    );
    const { id, secret } = created.body as { id: string; secret: string };
    const body = '{"event":"last"}';
    clock = Date.now();
    const headers = standardHeaders(secret, 'msg_last_place', body, Math.floor(clock / 1000));
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        sendWebhook(`${apps[i % 2]!.url}/api/client/v1/triggers/${id}/webhook`, body, headers),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(Array(12).fill(202));
    expect(new Set(answers.map((a) => a.body.id)).size).toBe(1);
    expect((await runsOf(id)).length).toBe(1);
  });
});
