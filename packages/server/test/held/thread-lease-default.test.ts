import { describe, expect, it } from 'vitest';
import { startTestServer, until } from '../helpers.js';

describe('the thread lease with nothing set', () => {
  it('a held run on a thread holds it for 60 s from its last renewal (3 x SLUICE_NODE_STALE_MS of 20 s)', async () => {
    const t = await startTestServer();
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const holder = t.call('POST', '/agents/echo/runs', { input: 'stall', thread_id: thread });
    await until(() => t.provider.inFlight === 1, 'the holder at the provider');
    const { left } = (
      await t.server.store.db.query<{ left: number }>(
        `SELECT extract(epoch FROM lock_expires_at - clock_timestamp())::float8 * 1000 AS left
         FROM threads WHERE id = $1`,
        [thread],
      )
    ).rows[0]!;
    // Taken or renewed (every 5 s) at most a few seconds ago: a 30 s or 120 s lease fails here.
    expect(left).toBeGreaterThan(50_000);
    expect(left).toBeLessThanOrEqual(60_000);
    const run = (await t.call('GET', '/agents/runs?status=running')).body.data[0].id as string;
    await t.call('POST', `/agents/runs/${run}/cancel`);
    expect((await holder).body.status).toBe('canceled');
  });
});
