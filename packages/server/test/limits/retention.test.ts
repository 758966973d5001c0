import { expect, it } from 'vitest';
import type { Store } from '@sluice/server';
import { pruneNodes } from '../../src/node/nodes.js';
import { BATCH, expireRuns, promoteDueDeferred } from '../../src/runs/lifecycle.js';
import { openTestStore } from '../helpers.js';

const embeddedStore = (): Promise<Store> => openTestStore('pglite');

it('L13: expiry moves at most its batch per pass, so a large backlog is ended over several short passes', async () => {
  const store = await embeddedStore();
  const backlog = 2 * BATCH + 200;
  // Queued deferred runs and scheduled runs, all past the wait, beside a recent one that must stay.
  await store.db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, created_at, scheduled_for)
     SELECT 'run_' || substr(md5('old' || g), 1, 24), 't', 'p', 'u', 'echo',
            CASE WHEN g % 2 = 0 THEN 'deferred' ELSE 'default' END, 'queued',
            CASE WHEN g % 2 = 0 THEN 'queued' ELSE 'scheduled' END, '"x"',
            clock_timestamp() - interval '3 days', CASE WHEN g % 2 = 1 THEN clock_timestamp() - interval '2 days' END
     FROM generate_series(1, $1::int) g`,
    [backlog],
  );
  await store.db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input)
     VALUES ('run_${'0'.repeat(24)}', 't', 'p', 'u', 'echo', 'deferred', 'queued', 'queued', '"x"')`,
  );
  const day = 24 * 3_600_000;
  expect(await expireRuns(store.db, day)).toBe(BATCH);
  expect(await expireRuns(store.db, day)).toBe(BATCH);
  expect(await expireRuns(store.db, day)).toBe(200);
  expect(await expireRuns(store.db, day)).toBe(0);
  const byStatus = (
    await store.db.query<{ status: string; n: number }>(
      `SELECT status, count(*)::int AS n FROM agent_runs GROUP BY status ORDER BY status`,
    )
  ).rows;
  expect(byStatus).toEqual([
    { status: 'failed', n: backlog },
    { status: 'queued', n: 1 },
  ]);
}, 60_000);

it('L13: server_nodes rows whose heartbeat is over a day old are pruned, live ones kept', async () => {
  const store = await embeddedStore();
  await store.db.query(
    `INSERT INTO server_nodes (id, started_at, heartbeat_at) VALUES
       ('node_gone', clock_timestamp() - interval '3 days', clock_timestamp() - interval '25 hours'),
       ('node_quiet', clock_timestamp() - interval '3 days', clock_timestamp() - interval '23 hours'),
       ('node_live', clock_timestamp(), clock_timestamp())`,
  );
  await pruneNodes(store.db);
  const left = (await store.db.query<{ id: string }>('SELECT id FROM server_nodes ORDER BY id')).rows;
  expect(left.map((r) => r.id)).toEqual(['node_live', 'node_quiet']);
}, 60_000);

it('R19: a promoted scheduled run expires 24 h after it became due, not 24 h after it was created', async () => {
  const store = await embeddedStore();
  // Both created 30 h ago (past the wait if it counted from creation); due 10 h and 25 h ago.
  await store.db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, created_at, scheduled_for)
     VALUES ('run_due_10h_ago_aaaaaaaaaaaaa', 't', 'p', 'u', 'echo', 'deferred', 'queued', 'scheduled', '"x"',
             clock_timestamp() - interval '30 hours', clock_timestamp() - interval '10 hours'),
            ('run_due_25h_ago_aaaaaaaaaaaaa', 't', 'p', 'u', 'echo', 'deferred', 'queued', 'scheduled', '"x"',
             clock_timestamp() - interval '30 hours', clock_timestamp() - interval '25 hours')`,
  );
  expect(await promoteDueDeferred(store.db)).toBe(2);
  expect(await expireRuns(store.db, 24 * 3_600_000)).toBe(1);
  const rows = (
    await store.db.query<{ id: string; status: string; type: string | null }>(
      `SELECT id, status, error ->> 'type' AS type FROM agent_runs ORDER BY id`,
    )
  ).rows;
  expect(rows).toEqual([
    { id: 'run_due_10h_ago_aaaaaaaaaaaaa', status: 'queued', type: null },
    { id: 'run_due_25h_ago_aaaaaaaaaaaaa', status: 'failed', type: 'expired' },
  ]);
}, 60_000);
