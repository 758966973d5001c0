import { expect, it } from 'vitest';
import { pruneGatewayUsage } from '../../src/gateway/accounting.js';
import { longestPeriodMs } from '../../src/runs/policy.js';
import { startTestServer } from '../harness/index.js';

const DAY = 24 * 3_600_000;

it('upkeep deletes gateway_usage rows older than the longest quota period, a batch a statement, and keeps the rest', async () => {
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
  // One statement of 3 a pass: the first pass takes 3.
  expect(await pruneGatewayUsage(db, longestPeriodMs, 3, 1)).toBe(3);
  // Statements of 3 while a statement finds 3: the rest of the old rows go in one pass.
  expect(await pruneGatewayUsage(db, longestPeriodMs, 3)).toBe(4);
  expect(await pruneGatewayUsage(db, longestPeriodMs, 3)).toBe(0);
  const { rows } = await db.query<{ days: number }>(
    `SELECT round(extract(epoch FROM clock_timestamp() - created_at) / 86400)::int AS days
     FROM gateway_usage ORDER BY id`,
  );
  expect(rows.map((r) => r.days)).toEqual([29, 28, 27]);
});

it('a pass keeps up with a gateway busier than one batch a pass: a backlog of 1,201 old rows goes in one pass of 500-row statements', async () => {
  const s = await startTestServer();
  const { db } = s.server.store;
  // Ten minutes of a gateway at 2 calls a second is 1,200 rows; the old pass took 500 of them.
  await db.query(
    `INSERT INTO gateway_usage (tenant, gateway, status, cost, created_at)
     SELECT 't', 'g', 200, 1, clock_timestamp() - interval '31 days' + n * interval '1 millisecond'
     FROM generate_series(1, 1201) AS n`,
  );
  await db.query(`INSERT INTO gateway_usage (tenant, gateway, status, cost) VALUES ('t', 'g', 200, 1)`);
  expect(await pruneGatewayUsage(db, longestPeriodMs, 500)).toBe(1201);
  const { rows } = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM gateway_usage');
  expect(rows[0]!.n).toBe(1);
});
