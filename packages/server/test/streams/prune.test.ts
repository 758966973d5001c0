import { expect, it } from 'vitest';
import { pruneEvents } from '../../src/streams/queries.js';
import { startTestServer, until } from '../harness/index.js';

it('a prune pass deletes a backlog of stored events larger than one batch, and keeps the events of runs that live', async () => {
  const s = await startTestServer();
  const { db } = s.server.store;
  // 1,201 rows of runs that are gone (2 batches of 500 and a short one), beside a live run's row.
  await db.query(
    `INSERT INTO agent_run_events (run_id, seq, events)
     SELECT 'gone_' || (n / 10), 1 + n % 10, '[["run.created", {}]]'::jsonb FROM generate_series(0, 1200) n`,
  );
  const live = await s.call('POST', '/agents/echo/runs', { input: 'y', wait: false, delay_seconds: 3600 });
  expect(live.status).toBe(202);
  const count = async (like: string) =>
    (
      await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM agent_run_events WHERE run_id LIKE $1`, [
        like,
      ])
    ).rows[0]!.n;
  expect(await count('gone_%')).toBe(1201);
  await until(async () => (await count(live.body.id as string)) > 0, 'the live run’s run.created stored');
  // One statement of 500 a pass (the old rule) leaves 701; a pass goes on while batches come full.
  expect(await pruneEvents(db, 600_000, 500, 1)).toBe(500);
  expect(await pruneEvents(db, 600_000, 500)).toBe(701);
  expect(await count('gone_%')).toBe(0);
  expect(await count(live.body.id as string)).toBeGreaterThan(0);
});
