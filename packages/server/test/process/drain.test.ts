import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, postgres, until } from '../helpers.js';
import { gate, send, startServer, startWorker, testDatabase } from './harness.js';
import { describeWith } from '../../../../scripts/service-suites.js';

// A real server process on its own PostgreSQL database, stopped by a real signal. The
// in-process drain (runs that finish in time, the rest interrupted) is in ../drain.test.ts.

const runs = '/api/client/v1/agents/echo/runs';

describeWith({ PostgreSQL: postgres })('a server process stopped by a signal', () => {
  it('M7, issue 8 item 6: during a SIGTERM drain every route (also /%61pi/...) answers 503 server_draining, /readyz 503, a waiter on a queued deferred run gets its 503 at once; heartbeats go on past the stale time, so a run ending in the drain window succeeds; exit 0', async () => {
    const database = await testDatabase();
    const release = gate();
    const provider = await startProviderStandIn({
      reply: async (r) => {
        const text = lastUserText(r);
        if (text.startsWith('hold')) await release.promise;
        return { text: `done ${text}` };
      },
    });
    afterThisTest(() => provider.close());
    const staleMs = 5_000;
    const env = {
      DATABASE_URL: database.url,
      PROVIDER_URL: provider.url,
      SLUICE_NODE_STALE_MS: String(staleMs),
      // Far longer than the stale time: without heartbeats during the drain, peers would fail
      // the draining process's runs as worker_lost long before it ends.
      AGENT_RUN_DRAIN_TIMEOUT_MS: '300000',
      // A waiter answered only at the end of its sync window would time the test out.
      AGENT_SYNC_TIMEOUT_MS: '600000',
      // One deferred run of the tenant at a time: a second one stays queued behind the first.
      AGENT_DEFERRED_MAX_RUNNING_PER_TENANT: '1',
    };
    const a = await startServer(env);
    const { secret: token } = await database.token();

    const inline = send(a.url, 'POST', runs, { token, body: { input: 'hold inline' } });
    const held = await send(a.url, 'POST', runs, {
      token,
      body: { input: 'hold deferred', class: 'deferred' },
    });
    expect(held.status).toBe(202);
    await until(() => provider.inFlight === 2, 'both held runs at the provider');
    const heldRows = await database.rows<{ id: string; worker: string }>(
      `SELECT id, worker FROM agent_runs WHERE status = 'running' ORDER BY id`,
    );
    expect(heldRows).toHaveLength(2);
    const nodeA = heldRows[0]!.worker;
    expect(heldRows.map((r) => r.worker)).toEqual([nodeA, nodeA]);
    // B stays up from here on and sweeps for lost runs every quarter of the stale time. It claims
    // nothing yet: the tenant's one deferred place is taken by A's held run.
    const b = await startServer(env);

    const waiting = send(a.url, 'POST', runs, {
      token,
      body: { input: 'queued deferred', class: 'deferred', wait: true },
    });
    let queuedId = '';
    await until(async () => {
      const rows = await database.rows<{ id: string }>(
        `SELECT id FROM agent_runs WHERE status = 'queued' AND class = 'deferred'`,
      );
      queuedId = rows[0]?.id ?? '';
      return rows.length === 1;
    }, 'the waited deferred run queued');

    a.child.kill('SIGTERM');
    await a.waitFor(/SIGTERM: draining/);
    const drainStart = (await database.rows<{ now: Date }>('SELECT clock_timestamp() AS now'))[0]!.now;

    // The waiter is answered now, not at the end of AGENT_SYNC_TIMEOUT_MS; its run goes on.
    const waited = await waiting;
    expect(waited.status).toBe(503);
    expect(waited.body.error).toMatchObject({
      type: 'server_draining',
      run: { id: queuedId, status: 'queued' },
    });

    const created = await send(a.url, 'POST', runs, { token, body: { input: 'late' } });
    expect([created.status, created.body.error?.type]).toEqual([503, 'server_draining']);
    expect(created.headers.get('retry-after')).toBe('1');
    const encoded = await send(a.url, 'POST', '/%61pi/client/v1/agents/echo/runs', {
      token,
      body: { input: 'late, encoded path' },
    });
    expect([encoded.status, encoded.body.error?.type]).toEqual([503, 'server_draining']);
    const read = await send(a.url, 'GET', `/api/client/v1/agents/runs/${queuedId}`, { token });
    expect([read.status, read.body.error?.type]).toEqual([503, 'server_draining']);
    const ready = await send(a.url, 'GET', '/readyz');
    expect(ready.status).toBe(503);
    // Nothing was admitted during the drain.
    expect(await database.rows(`SELECT id FROM agent_runs WHERE input::text LIKE '%late%'`)).toEqual([]);

    // Twice the stale time into the drain, A's heartbeat is still fresh (B has swept all along,
    // and would have failed A's runs had it gone stale): the held runs are still running.
    const beatsPast = async (node: string, after: Date) =>
      (
        await database.rows<{ n: number }>(
          `SELECT count(*)::int AS n FROM server_nodes WHERE id = $1 AND heartbeat_at > $2::timestamptz`,
          [node, after],
        )
      )[0]!.n === 1;
    const twoStaleLater = new Date(drainStart.getTime() + 2 * staleMs);
    await until(() => beatsPast(nodeA, twoStaleLater), 'A heartbeating two stale times into its drain');
    const nodeB = (
      await database.rows<{ id: string }>('SELECT id FROM server_nodes WHERE id <> $1', [nodeA])
    )[0]!.id;
    await until(() => beatsPast(nodeB, twoStaleLater), 'B sweeping two stale times into the drain');
    expect(
      (
        await database.rows<{ status: string }>('SELECT status FROM agent_runs WHERE id = ANY($1)', [
          heldRows.map((r) => r.id),
        ])
      ).map((r) => r.status),
    ).toEqual(['running', 'running']);

    release.open();
    const answered = await inline;
    expect(answered.status).toBe(200);
    expect(answered.body).toMatchObject({ status: 'succeeded', output: { text: 'done hold inline' } });
    expect(await a.closed).toEqual({ code: 0, signal: null });
    expect(a.output()).not.toContain('Interrupted');
    const ended = await database.rows<{ status: string; error: unknown }>(
      'SELECT status, error FROM agent_runs WHERE id = ANY($1)',
      [heldRows.map((r) => r.id)],
    );
    expect(ended).toEqual([
      { status: 'succeeded', error: null },
      { status: 'succeeded', error: null },
    ]);
    // A left the node table on its way out; the queued run it refused to wait on runs on B.
    expect(await database.rows('SELECT id FROM server_nodes WHERE id = $1', [nodeA])).toEqual([]);
    await until(async () => {
      const rows = await database.rows<{ status: string; worker: string }>(
        'SELECT status, worker FROM agent_runs WHERE id = $1',
        [queuedId],
      );
      return rows[0]?.status === 'succeeded' && rows[0].worker === nodeB;
    }, 'the deferred run done by B');
    b.child.kill('SIGTERM');
    expect(await b.closed).toEqual({ code: 0, signal: null });
  }, 180_000);

  it('L8: close() (the test worker on SIGTERM) ends a running run failed/interrupted, not canceled, and its caller gets 503 agent_run_interrupted', async () => {
    const database = await testDatabase();
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const server = await startWorker({ DATABASE_URL: database.url, PROVIDER_URL: provider.url });
    const { secret: token } = await database.token();

    const caller = send(server.url, 'POST', runs, { token, body: { input: 'forever' } });
    await until(() => provider.inFlight === 1, 'the run at the provider');
    server.child.kill('SIGTERM');

    const answer = await caller;
    expect(answer.status).toBe(503);
    expect(answer.body.error).toMatchObject({
      type: 'agent_run_interrupted',
      run: { status: 'failed', error: { type: 'interrupted' } },
    });
    expect(await server.closed).toEqual({ code: 0, signal: null });
    expect(await database.rows('SELECT status, error ->> $1 AS type FROM agent_runs', ['type'])).toEqual([
      { status: 'failed', type: 'interrupted' },
    ]);
    // The provider request was given up, not left to run on.
    await until(() => provider.inFlight === 0, 'the provider request closed');
    expect(provider.requests.map((r) => r.aborted)).toEqual([true]);
  }, 120_000);
});
