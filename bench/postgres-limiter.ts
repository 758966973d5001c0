/**
 * The PostgreSQL limiter against the spec's design, both in one run on one server.
 *
 *   spec   every waiting request polls on its own every 100 ms (one transaction per poll);
 *          a release only deletes its lease.
 *   ours   @sluice/postgres: whoever frees a slot hands it on (directly, or as an offer with
 *          a NOTIFY to the waiting process), one batched poll per process as the fallback.
 *
 * 4 worker processes x 50 requests that take a slot, hold it, give it back and ask again, on a
 * limit of 10 (2 reserved for the `interactive` workload). Each design has a database of its
 * own; a monitor connected to `postgres` reads xact_commit from pg_stat_database.
 *
 * Hand-off: from a wall-clock stamp taken just before a release is sent to the moment a
 * waiting acquire resolves, in any process (each grant is paired with the oldest release not
 * yet paired). Slot use: the time slots were held / (10 x the window).
 *
 * Run: npm run bench:postgres   (-- --quick for shorter windows, -- --smoke for the shortest).
 * The last line is JSON: `{"bench":"postgres","ours_100ms_tx_per_grant":…}` (durable commits).
 */
import pg from 'pg';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { spawnWorker } from '../packages/postgres/test/workers/spawn.js';
import { endPool, serverOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';

// --smoke: the smallest setting, for the test that the bench ends (its figures mean little).
const smoke = process.argv.includes('--smoke');
const quick = smoke || process.argv.includes('--quick');
const warmMs = smoke ? 200 : quick ? 1000 : 1500;
const durationMs = smoke ? 500 : quick ? 3000 : 6000;
const processes = 4;
// Requests in flight per process. Each finishes the one it waits for after the window, so a
// smoke run keeps fewer: 200 waiting on 10 slots of 500 ms holds take 10 s to wind down.
const loopsPerProcess = smoke ? 12 : 50;
const limits = {
  maxConcurrent: 10,
  leaseTtlMs: 30_000,
  workloads: { interactive: { reserved: 2, priority: 10 }, background: {} },
};

const url = (await ensurePostgres()) as string | undefined;
if (!url) throw new Error('No PostgreSQL server found or startable');
const { server, database: monitorDatabase } = serverOf(url);
const monitor = new pg.Client({ ...server, database: monitorDatabase });
await monitor.connect();
for (const design of ['spec', 'ours']) {
  await monitor.query(`DROP DATABASE IF EXISTS sluice_bench_${design} WITH (FORCE)`);
  await monitor.query(`CREATE DATABASE sluice_bench_${design}`);
}

interface Scenario {
  design: 'spec' | 'ours';
  holdMs: number;
  listen?: boolean;
  sync?: boolean;
}

interface Result {
  txPerSec: number;
  statementsPerSec: number;
  grantsPerSec: number;
  handOffP50: number;
  handOffP99: number;
  slotUse: number;
}

const percentile = (values: number[], p: number) => {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
};

async function xactCommit(database: string): Promise<number> {
  const r = await monitor.query('SELECT xact_commit::float8 AS n FROM pg_stat_database WHERE datname = $1', [
    database,
  ]);
  return r.rows[0].n;
}

async function run(s: Scenario): Promise<Result> {
  const database = `sluice_bench_${s.design}`;
  const pool = new pg.Pool({ ...server, database, max: 2 });
  pool.on('error', (error) => console.error(`setup pool: ${error.message}`));
  // Tables and stored limits in place, queue and leases empty.
  const setup = createPostgresConcurrencyLimiter({ ...limits, db: pool, schema: 'bench', name: 'bench' });
  await setup.ready();
  await setup.close();
  await pool.query('TRUNCATE bench.concurrency_leases, bench.concurrency_waiters');
  await endPool(pool);

  const startAt = Date.now() + 4000; // time for 4 processes to boot
  const env = {
    PG: JSON.stringify({ ...server, database }),
    DESIGN: s.design,
    HOLD_MS: String(s.holdMs),
    LOOPS: String(loopsPerProcess),
    START_AT: String(startAt),
    WARM_MS: String(warmMs),
    DURATION_MS: String(durationMs),
    LIMITS: JSON.stringify(limits),
    LISTEN: s.listen === false ? 'off' : 'on',
    SYNC: s.sync === false ? 'off' : 'on',
  };
  const workers = Array.from({ length: processes }, () =>
    spawnWorker(new URL('./postgres/worker.ts', import.meta.url), env),
  );
  const sleepUntil = (t: number) => new Promise((r) => setTimeout(r, Math.max(0, t - Date.now())));
  await sleepUntil(startAt + warmMs);
  const before = await xactCommit(database);
  await sleepUntil(startAt + warmMs + durationMs);
  const after = await xactCommit(database);
  const outputs = (await Promise.all(workers.map((w) => w.output))).map((o) =>
    JSON.parse(o.trim().split('\n').at(-1)!),
  );

  const releases = outputs.flatMap((o) => o.releases as number[]).sort((a, b) => a - b);
  const grants = outputs.flatMap((o) => o.grants as number[]).sort((a, b) => a - b);
  const handOffs: number[] = [];
  let r = 0;
  for (const g of grants) {
    if (r < releases.length && releases[r]! <= g) handOffs.push(g - releases[r++]!);
  }
  const seconds = durationMs / 1000;
  return {
    txPerSec: (after - before) / seconds,
    statementsPerSec: outputs.reduce((a, o) => a + o.statements, 0) / seconds,
    grantsPerSec: grants.length / seconds,
    handOffP50: percentile(handOffs, 50),
    handOffP99: percentile(handOffs, 99),
    slotUse: outputs.reduce((a, o) => a + o.heldMs, 0) / (limits.maxConcurrent * durationMs),
  };
}

const fmt = (n: number, digits = 0) => (Number.isFinite(n) ? n.toFixed(digits) : '-');
const table = (header: string[], rows: string[][]) => {
  const widths = header.map((_, i) => Math.max(...[header, ...rows].map((row) => row[i]!.length)));
  const line = (row: string[]) => `| ${row.map((c, i) => c.padEnd(widths[i]!)).join(' | ')} |`;
  return [line(header), `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`, ...rows.map(line)].join('\n');
};

console.log(
  `PostgreSQL limiter vs the spec's polling design: ${processes} processes x ${loopsPerProcess} requests, limit 10 (2 reserved)`,
);
console.log(
  `window ${durationMs / 1000} s after ${warmMs / 1000} s warm-up; ${new Date().toISOString().slice(0, 10)}, node ${process.version}\n`,
);

const header = [
  'design',
  'tx/s',
  'statements/s',
  'grants/s',
  'hand-off p50 ms',
  'hand-off p99 ms',
  'slot use',
];
const durable = new Map<number, { spec: Result; ours: Result }>();
for (const sync of quick ? [true] : [true, false]) {
  console.log(
    sync
      ? 'Durable commits (synchronous_commit on, the default of both):'
      : '\nCommits without waiting for the WAL flush (synchronousCommit: false, both designs):',
  );
  const results = new Map<string, Result>();
  for (const holdMs of [100, 500]) {
    results.set(`spec design, ${holdMs} ms holds`, await run({ design: 'spec', holdMs, sync }));
    results.set(`ours, ${holdMs} ms holds`, await run({ design: 'ours', holdMs, sync }));
  }
  console.log(
    table(
      header,
      [...results].map(([label, r]) => [
        label,
        fmt(r.txPerSec),
        fmt(r.statementsPerSec),
        fmt(r.grantsPerSec),
        fmt(r.handOffP50, 1),
        fmt(r.handOffP99, 1),
        fmt(r.slotUse, 2),
      ]),
    ),
  );
  for (const hold of [100, 500]) {
    const spec = results.get(`spec design, ${hold} ms holds`)!;
    const ours = results.get(`ours, ${hold} ms holds`)!;
    if (sync) durable.set(hold, { spec, ours });
    console.log(
      `${hold} ms holds: ours commits 1/${fmt(spec.txPerSec / ours.txPerSec, 1)} of the spec design's transactions; ` +
        `per grant ${fmt(ours.txPerSec / ours.grantsPerSec, 1)} against ${fmt(spec.txPerSec / spec.grantsPerSec, 1)}`,
    );
  }
}

// Where do NOTIFY wake-ups stop paying off? Shorter holds mean more grants a second.
console.log('\nNOTIFY wake-ups against polling alone (every 100 ms), ours, by hold time');
const crossRows: string[][] = [];
for (const holdMs of smoke ? [10] : quick ? [100, 10] : [200, 50, 10, 0]) {
  const on = await run({ design: 'ours', holdMs, listen: true });
  const off = await run({ design: 'ours', holdMs, listen: false });
  crossRows.push([
    `${holdMs} ms`,
    `${fmt(on.grantsPerSec)} / ${fmt(off.grantsPerSec)}`,
    `${fmt(on.handOffP50, 1)} / ${fmt(off.handOffP50, 1)}`,
    `${fmt(on.txPerSec)} / ${fmt(off.txPerSec)}`,
    `${fmt(on.slotUse, 2)} / ${fmt(off.slotUse, 2)}`,
  ]);
}
console.log(table(['hold', 'grants/s notify / poll', 'hand-off p50 ms', 'tx/s', 'slot use'], crossRows));
const asyncResult = await run({ design: 'ours', holdMs: 0, sync: false });
console.log(
  `\nours, 0 ms holds, synchronousCommit: false: ${fmt(asyncResult.grantsPerSec)} grants/s, hand-off p50 ${fmt(asyncResult.handOffP50, 1)} ms, slot use ${fmt(asyncResult.slotUse, 2)}`,
);
for (const design of ['spec', 'ours'])
  await monitor.query(`DROP DATABASE IF EXISTS sluice_bench_${design} WITH (FORCE)`);
await monitor.end();
const perGrant = (r: Result) => Number((r.txPerSec / r.grantsPerSec).toFixed(2));
console.log(
  JSON.stringify({
    bench: 'postgres',
    window_ms: durationMs,
    ...Object.fromEntries(
      [...durable].flatMap(([hold, { spec, ours }]) => [
        [`ours_${hold}ms_grants_per_s`, Number(ours.grantsPerSec.toFixed(1))],
        [`spec_${hold}ms_grants_per_s`, Number(spec.grantsPerSec.toFixed(1))],
        [`ours_${hold}ms_tx_per_grant`, perGrant(ours)],
        [`spec_${hold}ms_tx_per_grant`, perGrant(spec)],
        [`ours_${hold}ms_hand_off_p50_ms`, Number(ours.handOffP50.toFixed(1))],
      ]),
    ),
  }),
);
