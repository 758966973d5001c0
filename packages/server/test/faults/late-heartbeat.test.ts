import pg from 'pg';
import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { afterThisTest, freshDatabase, postgres, startTestServer, until } from '../helpers.js';

// Found by the soak: a server whose heartbeat was held by a stalled connection answered /readyz
// 200 (the ping went through a fresh connection) and went on claiming queued runs; its peers
// declared it lost at the stale time, and the runs it had claimed ended worker_lost with no
// fault in their life. Here the heartbeat is held the way PostgreSQL holds it: another session
// locks this process's row of server_nodes, so the heartbeat's upsert waits.

describeWith({ PostgreSQL: postgres })('a process whose heartbeat is late', () => {
  it('is not ready and claims no queued run until its heartbeat is written again', async () => {
    const databaseUrl = await freshDatabase();
    const t = await startTestServer({ databaseUrl, settings: { nodeStaleMs: 4_000 } });
    const ready = async () => (await fetch(`${t.server.url}/readyz`)).status;
    expect(await ready()).toBe(200);

    const holder = new pg.Client({ connectionString: databaseUrl });
    await holder.connect();
    afterThisTest(() => holder.end());
    await holder.query('BEGIN');
    const locked = await holder.query('SELECT id FROM server_nodes WHERE id = $1 FOR UPDATE', [
      t.server.executor.node,
    ]);
    expect(locked.rows).toHaveLength(1);

    // No heartbeat for half the stale time (2 s at least): not ready, and says why.
    await until(async () => (await ready()) === 503, '/readyz is 503 while the heartbeat waits');
    const body = await (await fetch(`${t.server.url}/readyz`)).json();
    expect(body).toEqual({ ready: false, reason: 'heartbeat late' });

    // A queued run admitted meanwhile (admission does not touch server_nodes) waits: its
    // workers are woken at once by the admission, and claim nothing while the heartbeat is late.
    const queued = await t.call('POST', '/agents/echo/runs', { input: 'later', wait: false });
    expect(queued.status).toBe(202);
    const id = queued.body.id as string;
    // The admission woke the workers; each look for work after it (the run was committed
    // before the 202) is held back. Two such looks seen: on the old code the first claimed it.
    const heldBefore = t.server.executor.claimsHeldBack;
    await until(
      () => t.server.executor.claimsHeldBack >= heldBefore + 2,
      'workers look for work after the admission and are held back',
    );
    const meanwhile = await holder.query<{ status: string }>('SELECT status FROM agent_runs WHERE id = $1', [
      id,
    ]);
    expect(meanwhile.rows[0]!.status).toBe('queued');

    await holder.query('COMMIT');
    await until(async () => (await ready()) === 200, '/readyz is 200 once the heartbeat is written');
    await until(
      async () => (await t.call('GET', `/agents/runs/${id}`)).body.status === 'succeeded',
      'the queued run runs once the heartbeat is back',
    );
  });
});
