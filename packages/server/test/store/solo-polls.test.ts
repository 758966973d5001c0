import { setTimeout as sleep } from 'node:timers/promises';
import { expect, it } from 'vitest';
import { tuning } from '../../src/tuning.js';
import { openTestStore, startTestServer, until } from '../helpers.js';
import { countingDatabase, type QueryCounts } from '../limits/harness.js';

// An embedded store has one writer, this process: the polls that look for other processes' work
// (idle workers, the callback outbox) come far apart, since each one holds the event loop that
// PGlite runs on. PostgreSQL is shared: its polls keep their pace.

it('an embedded store says it has no other writer; a PostgreSQL store does not', async () => {
  expect((await openTestStore('pglite')).solo).toBe(true);
  expect((await openTestStore('postgres')).solo).toBeFalsy();
});

/** The statements of the fallback polls, by the poll they belong to. */
const polls = {
  workers: /^SELECT EXISTS \(SELECT 1 FROM agent_runs WHERE status = 'queued'/,
  callbacks: /^\s*WITH due AS \(\s*SELECT id FROM callback_deliveries/,
};

async function idlePolls(database: 'pglite' | 'postgres', windowMs: number) {
  const seen = { workers: 0, callbacks: 0 };
  let counting = false;
  const counts: QueryCounts = {
    queries: 0,
    transactions: 0,
    onQuery: (text) => {
      if (!counting) return;
      for (const [poll, pattern] of Object.entries(polls))
        if (pattern.test(text)) seen[poll as keyof typeof seen]++;
    },
  };
  await startTestServer({
    database,
    wrapStore: (store) => ({ ...store, db: countingDatabase(store.db, counts) }),
  });
  // The start's own first looks are over by then: what is left is the idle pace.
  await sleep(1_000);
  counting = true;
  await sleep(windowMs);
  counting = false;
  return seen;
}

it('an idle server on the embedded store polls for work at a tenth of the shared pace', async () => {
  const windowMs = 2_500;
  // Timers never fire early, so these are hard bounds: each class's poller (default, deferred)
  // looks at most once in a window shorter than its period, the outbox at most once.
  expect(tuning.idlePollMs * tuning.soloPollFactor).toBeGreaterThan(windowMs);
  const solo = await idlePolls('pglite', windowMs);
  expect(solo.workers).toBeLessThanOrEqual(2);
  expect(solo.callbacks).toBeLessThanOrEqual(1);
});

it('on the embedded store, a cap freed by the lost-runs sweep is taken at once, not at the next idle poll', async () => {
  const t = await startTestServer({
    settings: { deferredMaxRunningPerTenant: 1, deferredConcurrency: 1, nodeStaleMs: 2_000 },
  });
  const db = t.server.store.db;
  expect(t.server.store.solo).toBe(true);
  // A deferred run of tenant t running on a process that died: the tenant's cap (1) is full.
  await db.query(`INSERT INTO server_nodes (id) VALUES ('node_dead')`);
  await db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, worker, started_at)
     VALUES ('run_lost', 't', 'p', 'u', 'echo', 'deferred', 'queued', 'running', '"x"', 'node_dead', clock_timestamp())`,
  );
  const queued = await t.call('POST', '/agents/echo/runs', {
    input: 'hello',
    class: 'deferred',
    wait: false,
  });
  expect(queued.status).toBe(202);
  expect((await t.statusOf(queued.body.id as string)).status).toBe('queued');
  // Its heartbeat goes stale: the next sweep (every 500 ms) ends its run, and nothing else
  // announces the room (the run had no thread).
  await db.query(
    `UPDATE server_nodes SET heartbeat_at = clock_timestamp() - interval '1 hour' WHERE id = 'node_dead'`,
  );
  await until(async () => (await t.statusOf(queued.body.id as string)).status === 'succeeded', 'the run');
  const { rows } = await db.query<{ ms: number }>(
    `SELECT ((extract(epoch FROM q.started_at) - extract(epoch FROM l.finished_at)) * 1000)::float8 AS ms
     FROM agent_runs q, agent_runs l WHERE q.id = $1::text AND l.id = 'run_lost'`,
    [queued.body.id],
  );
  // The idle poll would have taken up to idlePollMs * soloPollFactor (5 s).
  expect(rows[0]!.ms).toBeLessThan((tuning.idlePollMs * tuning.soloPollFactor) / 2);
});
