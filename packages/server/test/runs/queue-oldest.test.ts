import { expect, it } from 'vitest';
import { startTestServer } from '../helpers.js';

it('R34: oldest_queued_at is when the longest-waiting queued deferred run became due, in epoch seconds', async () => {
  const t = await startTestServer({ background: false });
  const token = await t.token({ tenant: 'q', project: 'p', role: 'member' });
  const epoch = async (sql: string) =>
    (await t.server.store.db.query<{ s: number }>(`SELECT floor(extract(epoch FROM ${sql}))::float8 AS s`))
      .rows[0]!.s;
  // Created 30 h ago but due 10 h ago (a promoted scheduled run), beside one created and queued
  // 5 h ago; a queued default-class run and a still scheduled deferred one are older, and left out.
  await t.server.store.db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, created_at, scheduled_for) VALUES
       ('run_promoted_aaaaaaaaaaaaaaaa', 'q', 'p', 'u', 'echo', 'deferred', 'queued', 'queued', '"x"',
        date_trunc('second', clock_timestamp()) - interval '30 hours', date_trunc('second', clock_timestamp()) - interval '10 hours'),
       ('run_queued_5h_aaaaaaaaaaaaaaa', 'q', 'p', 'u', 'echo', 'deferred', 'queued', 'queued', '"x"',
        clock_timestamp() - interval '5 hours', NULL),
       ('run_default_aaaaaaaaaaaaaaaaa', 'q', 'p', 'u', 'echo', 'default', 'queued', 'queued', '"x"',
        clock_timestamp() - interval '40 hours', NULL),
       ('run_scheduled_aaaaaaaaaaaaaaa', 'q', 'p', 'u', 'echo', 'deferred', 'queued', 'scheduled', '"x"',
        clock_timestamp() - interval '50 hours', clock_timestamp() + interval '1 hour')`,
  );
  const dueAt = await epoch(
    `(SELECT scheduled_for FROM agent_runs WHERE id = 'run_promoted_aaaaaaaaaaaaaaaa')`,
  );
  const createdAt = await epoch(
    `(SELECT created_at FROM agent_runs WHERE id = 'run_promoted_aaaaaaaaaaaaaaaa')`,
  );
  expect(dueAt - createdAt).toBe(20 * 3600);
  const queue = (await t.call('GET', '/agents/runs/queue', undefined, token)).body;
  expect(queue.deferred).toMatchObject({ queued: 2, scheduled: 1, oldest_queued_at: dueAt });
  expect(queue.default).toMatchObject({ queued: 1 });
});
