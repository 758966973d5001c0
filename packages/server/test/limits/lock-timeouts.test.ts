import pg from 'pg';
import { expect, it } from 'vitest';
import { ADMISSIONS_PER_TENANT } from '../../src/runs/turns.js';
import { afterThisTest, freshDatabase, postgres, startTestServer, until } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgres })('on PostgreSQL', () => {
  it("M9: while another session holds a tenant's admission lock, its POSTs answer 503 store_unavailable after the lock timeout, and other tenants are answered at once", async () => {
    const databaseUrl = await freshDatabase();
    // A small pool: a tenant whose every request held a connection while waiting would take it all.
    const t = await startTestServer({ databaseUrl, settings: { statementTimeoutMs: 5000, poolSize: 4 } });
    const a = await t.token({ tenant: 'a' });
    const b = await t.token({ tenant: 'b' });
    const holder = new pg.Client({ connectionString: databaseUrl });
    await holder.connect();
    afterThisTest(() => holder.end());
    const lockWaiters = async () =>
      (
        await holder.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`,
        )
      ).rows[0]!.n;
    await holder.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:a'))`);

    const started = Date.now();
    const one = await t.call('POST', '/agents/echo/runs', { input: 'x', wait: false }, a);
    expect(one.status).toBe(503);
    expect(one.body.error.type).toBe('store_unavailable');
    expect(one.retryAfter).not.toBeNull();
    expect(Date.now() - started).toBeGreaterThanOrEqual(4000);

    // More of a's requests than there are connections.
    let received = 0;
    t.server.fastify.server.on('request', (request: { method?: string }) => {
      if (request.method === 'POST') received++;
    });
    const log: string[] = [];
    const burst = Array.from({ length: 8 }, (_, i) =>
      t.call('POST', '/agents/echo/runs', { input: `a${i}`, wait: false }, a).then((r) => {
        log.push(`a ${r.status}`);
        return r;
      }),
    );
    await until(async () => received === 8 && (await lockWaiters()) >= 1, "a's requests wait for the lock");
    const other = await t.call('POST', '/agents/echo/runs', { input: 'b', wait: false }, b);
    log.push(`b ${other.status}`);
    expect((await t.call('GET', '/agents/runs/queue', undefined, b)).status).toBe(200);
    expect(log).toEqual(['b 202']);
    // a's requests wait in the process, not each on a connection of its own.
    expect(await lockWaiters()).toBeLessThanOrEqual(ADMISSIONS_PER_TENANT);

    await holder.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:a'))`);
    for (const r of await Promise.all(burst)) {
      expect([202, 503]).toContain(r.status);
      if (r.status === 503) expect(r.body.error.type).toBe('store_unavailable');
    }
    expect((await t.call('POST', '/agents/echo/runs', { input: 'again', wait: false }, a)).status).toBe(202);
  }, 120_000);
});
