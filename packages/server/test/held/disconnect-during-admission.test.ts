import { request } from 'node:http';
import pg from 'pg';
import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, freshDatabase, postgres, startTestServer, until } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/*
 * The lazy client-gone signal: the signal of a held run is made only after
 * admission now, so a client that left while admission waited must be seen from the response's
 * state (destroyed), not from a 'close' event that fired before anyone listened.
 */
describeWith({ PostgreSQL: postgres })("on_disconnect: 'cancel' with the lazy client-gone signal", () => {
  it('a held (not streamed) run whose client left while admission waited for the tenant lock is canceled', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const databaseUrl = await freshDatabase();
    const t = await startTestServer({ provider, databaseUrl });

    const blocker = new pg.Client({ connectionString: databaseUrl });
    await blocker.connect();
    afterThisTest(() => blocker.end());
    await blocker.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:t'))`);

    const { hostname, port } = new URL(t.server.url);
    const payload = JSON.stringify({ input: 'hello', on_disconnect: 'cancel' });
    const req = request({
      host: hostname,
      port: Number(port),
      method: 'POST',
      path: '/api/client/v1/agents/echo/runs',
      agent: false,
      headers: {
        authorization: `Bearer ${t.admin}`,
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(payload),
      },
    });
    req.on('error', () => undefined);
    req.end(payload);
    await until(
      async () =>
        (
          await blocker.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          )
        ).rows[0]!.n === 1,
      'the admission waiting for the tenant lock',
    );
    const connections = () =>
      new Promise<number>((resolve, reject) =>
        t.server.fastify.server.getConnections((error, n) => (error ? reject(error) : resolve(n))),
      );
    req.destroy();
    await until(async () => (await connections()) === 0, 'the server seeing the client go');
    await blocker.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:t'))`);
    await until(
      async () =>
        (await t.call('GET', '/agents/runs')).body.data.some((r: { status: string }) =>
          ['succeeded', 'failed', 'canceled'].includes(r.status),
        ),
      'the run ending (the model stalls: only a cancel ends it)',
    );
    expect((await t.call('GET', '/agents/runs')).body.data[0].status).toBe('canceled');
  }, 30_000);
});
