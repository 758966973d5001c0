import { request } from 'node:http';
import pg from 'pg';
import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, freshDatabase, postgres, startTestServer, until } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * `on_disconnect: 'cancel'` is wired as `gone.addEventListener('abort', ...)` after the run was
 * admitted (routes/create-run.ts, after the admission try block). A client that went away
 * while its request waited (for the thread, or for the tenant's admission lock) aborted that
 * signal already; a listener added to an aborted signal never runs, so the run executes in
 * full for nobody.
 */
describeWith({ PostgreSQL: postgres })('on_disconnect cancel and a client gone before admission', () => {
  it("a streamed run with on_disconnect: 'cancel' whose client left while admission waited is not run", async () => {
    const provider = await startProviderStandIn({ reply: () => ({ text: 'spent for nobody' }) });
    afterThisTest(() => provider.close());
    const databaseUrl = await freshDatabase();
    const t = await startTestServer({ provider, databaseUrl });

    // Another session holds the tenant's admission lock, as a slow admission elsewhere would.
    const blocker = new pg.Client({ connectionString: databaseUrl });
    await blocker.connect();
    afterThisTest(() => blocker.end());
    await blocker.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:t'))`);

    const { hostname, port } = new URL(t.server.url);
    const payload = JSON.stringify({ input: 'hello', stream: true, on_disconnect: 'cancel' });
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
    expect(await connections()).toBe(1);
    req.destroy();
    await until(async () => (await connections()) === 0, 'the server seeing the client go');

    await blocker.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:t'))`);
    await until(
      async () =>
        (await t.call('GET', '/agents/runs')).body.data.some((r: { status: string }) =>
          ['succeeded', 'failed', 'canceled'].includes(r.status),
        ),
      'the run ending',
    );
    const run = (await t.call('GET', '/agents/runs')).body.data[0];
    // Fails: the run was admitted and ran to the end ('succeeded', a provider request made).
    expect(run.status).toBe('canceled');
    expect(provider.requests.filter((r) => r.done)).toHaveLength(0);
  });
});
