import { expect, it } from 'vitest';
import { pruneGatewayUsage } from '../../src/gateway/accounting.js';
import { longestPeriodMs } from '../../src/runs/policy.js';
import { startTestServer } from '../harness/index.js';

const DAY = 24 * 3_600_000;

it('upkeep deletes gateway_usage rows older than the longest quota period, a batch at a time, and keeps the rest', async () => {
  const s = await startTestServer();
  const { db } = s.server.store;
  // 7 rows past a month, then 3 inside it (the oldest of those 29 days old, still in a month's window).
  for (let i = 0; i < 10; i++)
    await db.query(
      `INSERT INTO gateway_usage (tenant, gateway, status, cost, created_at)
       VALUES ('t', 'g', 200, 1, clock_timestamp() - $1::float8 * interval '1 millisecond')`,
      [(i < 7 ? 40 - i : 29 - (i - 7)) * DAY],
    );
  expect(longestPeriodMs).toBe(30 * DAY);
  const passes: number[] = [];
  for (let n = -1; n !== 0;) passes.push((n = await pruneGatewayUsage(db, longestPeriodMs, 3)));
  expect(passes).toEqual([3, 3, 1, 0]);
  const { rows } = await db.query<{ days: number }>(
    `SELECT round(extract(epoch FROM clock_timestamp() - created_at) / 86400)::int AS days
     FROM gateway_usage ORDER BY id`,
  );
  expect(rows.map((r) => r.days)).toEqual([29, 28, 27]);
});
