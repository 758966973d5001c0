import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { createAgent, createConcurrencyLimiter } from 'sluice';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { AdmissionLog } from '../../src/ops/admissions.js';
import { RunCounts } from '../../src/ops/run-counts.js';
import { metricsTokenOf } from '../../src/routes/metrics.js';
import {
  afterThisTest,
  freshDatabase,
  postgres,
  startTestServer,
  until,
  type Body,
  type TestServer,
} from '../helpers.js';
import { gatedStandIn, parseMetrics, sample, scrape } from './ops-helpers.js';
import { itWith } from '../../../../scripts/service-suites.js';

const slot = { limiter: 'model', workload: 'default' };
const metricsSecret = 'metrics-secret-0123456789';

/** The metrics token or an admin token is let in; 401 for anything else, 403 for a member or reader. */
async function checkScrapeAuth(t: TestServer): Promise<void> {
  const url = t.server.url;
  expect((await scrape(url, metricsSecret)).status).toBe(200);
  expect((await scrape(url, t.admin)).status).toBe(200);
  for (const role of ['member', 'read'] as const) {
    const refused = await scrape(url, await t.token({ role }));
    expect(refused.status).toBe(403);
    expect(JSON.parse(refused.text).error.code).toBe('permission_denied');
    expect(refused.text).not.toContain('sluice_');
  }
  for (const wrong of [undefined, `${metricsSecret}x`, metricsSecret.slice(0, -1), 'sk_unknown']) {
    const r = await scrape(url, wrong);
    expect(r.status).toBe(401);
    expect(r.text).not.toContain('sluice_');
  }
  // Another scheme, or the secret outside the header, is not the token.
  const basic = await fetch(`${url}/metrics`, { headers: { authorization: `Basic ${metricsSecret}` } });
  expect(basic.status).toBe(401);
  expect((await fetch(`${url}/metrics?token=${metricsSecret}`)).status).toBe(401);
}

/**
 * The dashboard's data while tenant `t` has two runs (one holding the slot, one waiting) and one
 * refusal: the operator sees every tenant, an admin only its own, a member nothing.
 */
async function checkOverview(t: TestServer): Promise<void> {
  const overview = (secret?: string) =>
    fetch(`${t.server.url}/api/client/v1/ops/overview`, {
      headers: secret === undefined ? {} : { authorization: `Bearer ${secret}` },
    });
  const operator = await overview(metricsSecret);
  expect(operator.status).toBe(200);
  expect(operator.headers.get('cache-control')).toBe('no-store');
  const all = (await operator.json()) as Body;
  expect(all.limiters).toEqual([{ ...slot, active: 1, queued: 1, source: 'stats' }]);
  expect(all.runs).toContainEqual({ tenant: 't', class: 'default', status: 'running', count: 2 });
  expect(all.refusals).toEqual([
    {
      at: expect.any(String),
      tenant: 't',
      class: 'default',
      outcome: 'max_active_runs',
      scope: 'tenant',
      limit: 2,
      current: 2,
    },
  ]);
  const own = (await (await overview(t.admin)).json()) as Body;
  expect(own.runs).toEqual(all.runs);
  expect(own.refusals).toEqual(all.refusals);
  // Another tenant's admin sees the shared limiter, and nothing of tenant t.
  const other = await overview(await t.token({ tenant: 'other' }));
  expect(other.status).toBe(200);
  const theirs = (await other.json()) as Body;
  expect(theirs.limiters).toEqual(all.limiters);
  expect(theirs.runs).toEqual([]);
  expect(theirs.refusals).toEqual([]);
  expect((await overview(await t.token({ role: 'member' }))).status).toBe(403);
  expect((await overview()).status).toBe(401);
  expect((await overview('sk_unknown')).status).toBe(401);
}

describe('GET /metrics', () => {
  it('moves with the runs: slots held and waited for, waits measured, admissions and refusals counted', async () => {
    const { provider, release } = await gatedStandIn();
    // One slot: the second run waits for it. A tenant cap of 2 refuses the third.
    const limiter = createConcurrencyLimiter({ name: 'model', maxConcurrent: 1 });
    process.env.SLUICE_METRICS_TOKEN = metricsSecret;
    let t;
    try {
      t = await startTestServer({
        provider,
        // PostgreSQL where there is one (always under CI): it opens faster than embedded PGlite.
        databaseUrl: postgres ? await freshDatabase() : undefined,
        settings: { maxActivePerTenant: 2 },
        agents: (model) => ({
          slow: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
        }),
      });
    } finally {
      delete process.env.SLUICE_METRICS_TOKEN;
    }
    await checkScrapeAuth(t);
    const read = async () => {
      const r = await scrape(t.server.url, t.admin);
      expect(r.status).toBe(200);
      expect(r.type).toMatch(/^text\/plain; version=0\.0\.4/);
      return parseMetrics(r.text);
    };

    // Before any run: the configured limiter is listed at zero, every class and status too.
    let m = await read();
    expect(sample(m, 'sluice_limiter_slots_active', slot)).toBe(0);
    expect(sample(m, 'sluice_limiter_queued', slot)).toBe(0);
    expect(sample(m, 'sluice_runs', { class: 'deferred', status: 'requires_action' })).toBe(0);
    // The process's own metrics come from this app's registry.
    expect(sample(m, 'process_cpu_user_seconds_total')).toBeGreaterThan(0);
    expect(m.has('nodejs_eventloop_lag_seconds')).toBe(true);

    const a = await t.call('POST', '/agents/slow/runs', { input: 'first', wait: false });
    expect(a.status).toBe(202);
    await until(() => provider.inFlight === 1, 'the first run holds the slot');
    m = await read();
    expect(sample(m, 'sluice_limiter_slots_active', slot)).toBe(1);
    expect(sample(m, 'sluice_limiter_queued', slot)).toBe(0);
    expect(sample(m, 'sluice_runs', { class: 'default', status: 'running' })).toBe(1);

    const b = await t.call('POST', '/agents/slow/runs', { input: 'second', wait: false });
    expect(b.status).toBe(202);
    await until(
      async () => sample(await read(), 'sluice_limiter_queued', slot) === 1,
      'the second run waits for the slot',
    );
    m = await read();
    expect(sample(m, 'sluice_limiter_slots_active', slot)).toBe(1);
    expect(sample(m, 'sluice_runs', { class: 'default', status: 'running' })).toBe(2);
    expect(sample(m, 'sluice_limiter_wait_seconds_count', slot)).toBe(1);

    // Over the tenant cap: refused, and counted under the limit's name.
    const c = await t.call('POST', '/agents/slow/runs', { input: 'third', wait: false });
    expect(c.status).toBe(429);
    await checkOverview(t);

    // Another tenant's run waits for the slot too, and is canceled while it waits: it leaves the
    // queue and the running count at once, and shows as canceled.
    const other = await t.token({ tenant: 'other' });
    const w = await t.call('POST', '/agents/slow/runs', { input: 'waiter', wait: false }, other);
    expect(w.status).toBe(202);
    await until(
      async () => sample(await read(), 'sluice_limiter_queued', slot) === 2,
      'the other tenant’s run waits too',
    );
    expect([200, 202]).toContain(
      (await t.call('POST', `/agents/runs/${w.body.id}/cancel`, {}, other)).status,
    );
    await until(
      async () =>
        (await t.call('GET', `/agents/runs/${w.body.id}`, undefined, other)).body.status === 'canceled',
      'the waiting run is canceled',
    );
    await until(
      async () => sample(await read(), 'sluice_limiter_queued', slot) === 1,
      'the canceled run leaves the queue',
    );
    t.server.ops.runs.expire();
    m = await read();
    expect(sample(m, 'sluice_limiter_slots_active', slot)).toBe(1);
    expect(sample(m, 'sluice_runs', { class: 'default', status: 'running' })).toBe(2);
    expect(sample(m, 'sluice_runs', { class: 'default', status: 'canceled' })).toBe(1);

    release('first');
    await until(async () => (await t.statusOf(b.body.id)).status === 'running' && provider.inFlight === 1);
    await until(async () => (await t.statusOf(a.body.id)).status === 'succeeded', 'the first run ends');
    m = await read();
    expect(sample(m, 'sluice_limiter_slots_active', slot)).toBe(1);
    expect(sample(m, 'sluice_limiter_queued', slot)).toBe(0);
    expect(sample(m, 'sluice_limiter_wait_seconds_count', slot)).toBe(2);
    // The second run waited for the first: its wait is above the smallest bucket's zero.
    expect(sample(m, 'sluice_limiter_wait_seconds_sum', slot)).toBeGreaterThan(0);

    release('second');
    await until(async () => (await t.statusOf(b.body.id)).status === 'succeeded', 'the second run ends');
    t.server.ops.runs.expire();
    m = await read();
    expect(sample(m, 'sluice_limiter_slots_active', slot)).toBe(0);
    expect(sample(m, 'sluice_limiter_queued', slot)).toBe(0);
    expect(sample(m, 'sluice_runs', { class: 'default', status: 'running' })).toBe(0);
    expect(sample(m, 'sluice_runs', { class: 'default', status: 'succeeded' })).toBe(2);
    expect(sample(m, 'sluice_run_admissions_total', { class: 'default', outcome: 'admitted' })).toBe(3);
    expect(sample(m, 'sluice_run_admissions_total', { class: 'default', outcome: 'max_active_runs' })).toBe(
      1,
    );
    expect(sample(m, 'sluice_run_admissions_total', { class: 'deferred', outcome: 'admitted' })).toBe(0);

    // Ended runs are counted again only once their count is `finalMaxAgeMs` old; live ones always.
    let now = 0;
    const counts = new RunCounts(t.server.store.db, { finalMaxAgeMs: 1_000, now: () => now });
    const count = async (status: string) =>
      (await counts.read()).filter((r) => r.status === status).reduce((n, r) => n + r.count, 0);
    expect(await count('succeeded')).toBe(2);
    release('fourth');
    const d = await t.call('POST', '/agents/slow/runs', { input: 'fourth', wait: false });
    await until(async () => (await t.statusOf(d.body.id)).status === 'succeeded', 'the fourth run ends');
    now = 999;
    expect(await count('succeeded')).toBe(2);
    now = 1_000;
    expect(await count('succeeded')).toBe(3);
  });

  it('keeps each tenant’s last refusals: a tenant flooding refusals does not push another’s out of its view', () => {
    const log = new AdmissionLog(3, () => new Date(0));
    const refusal = (limitValue: number) =>
      ({ kind: 'quota', class: 'default', limitValue, used: limitValue }) as const;
    log.refused('quiet', refusal(1));
    for (let i = 0; i < 10; i++) log.refused('loud', refusal(100 + i));
    // The operator's list is the last three of all; each tenant keeps its own last three.
    expect(log.recent().map((r) => r.limit)).toEqual([109, 108, 107]);
    expect(log.recent('quiet').map((r) => [r.tenant, r.limit])).toEqual([['quiet', 1]]);
    expect(log.recent('loud').map((r) => r.limit)).toEqual([109, 108, 107]);
    expect(log.recent('nobody')).toEqual([]);
  });

  it('refuses a metrics token too short to be a secret, without showing it', () => {
    for (const [value, length] of [
      ['short', 5],
      ['has a space in it, long enough', 30],
      ['x'.repeat(513), 513],
    ] as const) {
      expect(() => metricsTokenOf({ SLUICE_METRICS_TOKEN: value })).toThrow(
        `Expected SLUICE_METRICS_TOKEN to be 16 to 512 characters without spaces, got ${length} characters`,
      );
    }
    expect(metricsTokenOf({ SLUICE_METRICS_TOKEN: '' })).toBeUndefined();
    expect(metricsTokenOf({ SLUICE_METRICS_TOKEN: metricsSecret })).toBe(metricsSecret);
  });

  itWith({ PostgreSQL: postgres })(
    'shows a shared PostgreSQL limiter as a whole: either server counts both servers’ slots',
    async () => {
      const url = await freshDatabase();
      const { provider, release } = await gatedStandIn();
      const servers = [];
      for (let i = 0; i < 2; i++) {
        const pool = new pg.Pool({ connectionString: url, max: 4 });
        pool.on('error', () => undefined); // its database is dropped after the test
        const limiter = createPostgresConcurrencyLimiter({ db: pool, name: 'shared', maxConcurrent: 3 });
        afterThisTest(async () => {
          await limiter.close();
          await pool.end();
        });
        servers.push(
          await startTestServer({
            provider,
            databaseUrl: url,
            agents: (model) => ({
              slow: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
            }),
          }),
        );
      }
      const [one, two] = servers as [(typeof servers)[0], (typeof servers)[0]];
      const shared = { limiter: 'shared', workload: 'default' };
      const active = async (url: string, token: string) =>
        sample(parseMetrics((await scrape(url, token)).text), 'sluice_limiter_slots_active', shared);

      const a = await one.call('POST', '/agents/slow/runs', { input: 'on one', wait: false });
      await until(() => provider.inFlight === 1, 'a run on server one holds a slot');
      expect(await active(two.server.url, two.admin)).toBe(1);
      const b = await two.call('POST', '/agents/slow/runs', { input: 'on two', wait: false });
      await until(() => provider.inFlight === 2, 'a run on server two holds a slot');
      expect(await active(one.server.url, one.admin)).toBe(2);
      expect(await active(two.server.url, two.admin)).toBe(2);
      // Runs are counted from the database too: server two sees server one's run.
      const runs = parseMetrics((await scrape(two.server.url, two.admin)).text);
      expect(sample(runs, 'sluice_runs', { class: 'default', status: 'running' })).toBe(2);

      release('on one');
      release('on two');
      await until(async () => (await one.statusOf(a.body.id)).status === 'succeeded');
      await until(async () => (await two.statusOf(b.body.id)).status === 'succeeded');
      expect(await active(one.server.url, one.admin)).toBe(0);
    },
  );
});
