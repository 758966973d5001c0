import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, postgres, until } from '../helpers.js';
import { send, startServer, testDatabase } from './harness.js';
import { describeWith } from '../../../../scripts/service-suites.js';

describeWith({ PostgreSQL: postgres })('a server process frozen past the stale time', () => {
  it('M8: after kill -STOP A until B declares its run worker_lost, kill -CONT A: A aborts the provider request, the row stays failed/worker_lost, A answers its caller with the failed run', async () => {
    const database = await testDatabase();
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const env = { DATABASE_URL: database.url, PROVIDER_URL: provider.url, SLUICE_NODE_STALE_MS: '1500' };
    const a = await startServer(env);
    const b = await startServer(env);
    const { secret: token } = await database.token();

    const caller = send(a.url, 'POST', '/api/client/v1/agents/echo/runs', { token, body: { input: 'slow' } });
    await until(() => provider.inFlight === 1, 'the run at the provider');
    const [run] = await database.rows<{ id: string; worker: string }>('SELECT id, worker FROM agent_runs');
    const nodes = await database.rows<{ id: string }>('SELECT id FROM server_nodes');
    expect(nodes.map((n) => n.id)).toContain(run!.worker);

    // Frozen, A cannot heartbeat. No fixed pause: A stays stopped until B has seen its heartbeat
    // older than the stale time (1.5 s) and failed the run, however long B takes to notice.
    process.kill(a.pid, 'SIGSTOP');
    const lost = async () =>
      (
        await database.rows<{ status: string; type: string | null }>(
          `SELECT status, error ->> 'type' AS type FROM agent_runs WHERE id = $1`,
          [run!.id],
        )
      )[0]!;
    try {
      await until(async () => (await lost()).status !== 'running', 'B declaring the run lost');
    } finally {
      process.kill(a.pid, 'SIGCONT');
    }
    expect(await lost()).toEqual({ status: 'failed', type: 'worker_lost' });
    // Still open at the provider: A was frozen, not dead.
    expect(provider.inFlight).toBe(1);

    // Awake, A finds the run is no longer its own and stops spending on it.
    await until(() => provider.inFlight === 0, 'A aborting the provider request');
    expect(provider.requests.map((r) => [r.aborted, r.done])).toEqual([[true, false]]);
    const answer = await caller;
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ id: run!.id, status: 'failed', error: { type: 'worker_lost' } });
    expect(await lost()).toEqual({ status: 'failed', type: 'worker_lost' });
    // A is healthy again: it serves and heartbeats. Its first heartbeat after the freeze may
    // still be on its way when the caller is answered (a late heartbeat answers 503 until one
    // is written), so A is given until it writes one.
    await until(
      async () => (await send(a.url, 'GET', '/readyz')).status === 200,
      'A ready again after its heartbeat',
    );
    a.child.kill('SIGTERM');
    b.child.kill('SIGTERM');
    expect(await a.closed).toEqual({ code: 0, signal: null });
    expect(await b.closed).toEqual({ code: 0, signal: null });
    expect(provider.requests).toHaveLength(1);
  }, 180_000);
});
