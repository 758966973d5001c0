/**
 * How long one key's burst holds another key's next request back, in grants: key A asks for
 * 1,000 slots at once in a workload of N slots, then key B asks once. Counted: A's grants
 * before B's (those already running when B asked included). FIFO is the same run with no keys
 * (every request on the one implicit key, which is how Sluice served a workload before keys);
 * fair gives A and B their keys. In memory and on PostgreSQL (a fresh database).
 *
 * Every slot is held until B is in the queue, then handed on as soon as it is granted, so the
 * count depends on the queue order alone, not on timing: the figures are exact and the same
 * on every run. With start-time fair queuing (allocate.ts), B's request gets the virtual time
 * as its tag and is next once a slot frees: A's grants before it are the N already running.
 *
 * Then the server's default-class run queue (./fairness/default-queue.ts): tenant A's claims
 * before tenant B's one queued run, with 250 of A's queued.
 *
 * Run: npm run bench:fairness
 */
import pg from 'pg';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { createConcurrencyLimiter, type ConcurrencyLimiter } from 'sluice/concurrency';
import { endPool, serverOf, urlOf } from '../scripts/postgres-config.js';
import { defaultQueue } from './fairness/default-queue.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';

const burst = 1_000;
const slotCounts = [1, 4, 16];

type Limiter = ConcurrencyLimiter<'default'>;

async function untilQueued(limiter: Limiter, n: number): Promise<void> {
  for (let i = 0; i < 20_000; i++) {
    if ((await limiter.stats!()).queued === n) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error(`expected ${n} queued requests`);
}

/** A's grants before B's, and the whole run's time (ms). */
async function run(limiter: Limiter, slots: number, keyed: boolean): Promise<{ before: number; ms: number }> {
  const start = performance.now();
  const log: string[] = [];
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const ask = (who: 'A' | 'B') =>
    limiter.acquire({ key: keyed ? who : undefined }).then(async (lease) => {
      log.push(who);
      await gate;
      await limiter.release(lease);
    });
  const all: Promise<void>[] = [];
  for (let i = 0; i < burst; i++) all.push(ask('A'));
  await untilQueued(limiter, burst - slots);
  all.push(ask('B'));
  await untilQueued(limiter, burst - slots + 1);
  open();
  await Promise.all(all);
  return { before: log.indexOf('B'), ms: performance.now() - start };
}

interface Row {
  kind: 'memory' | 'postgres';
  slots: number;
  fifo: number;
  fair: number;
  fifoMs: number;
  fairMs: number;
}
const rows: Row[] = [];

for (const slots of slotCounts) {
  const fifo = await run(createConcurrencyLimiter({ maxConcurrent: slots }), slots, false);
  const fair = await run(createConcurrencyLimiter({ maxConcurrent: slots }), slots, true);
  rows.push({
    kind: 'memory',
    slots,
    fifo: fifo.before,
    fair: fair.before,
    fifoMs: fifo.ms,
    fairMs: fair.ms,
  });
}

const url = (await ensurePostgres()) as string | undefined;
if (!url) throw new Error('No PostgreSQL server found or startable');
const { server, database: adminDatabase } = serverOf(url);
const admin = new pg.Client({ ...server, database: adminDatabase });
await admin.connect();
await admin.query('DROP DATABASE IF EXISTS sluice_bench_fairness WITH (FORCE)');
await admin.query('CREATE DATABASE sluice_bench_fairness');
const pool = new pg.Pool({ ...server, database: 'sluice_bench_fairness', max: 4 });
// An idle connection whose backend is terminated (the database dropped, a restart) reports it here.
pool.on('error', (error) => console.error(`pool: ${error.message}`));
let n = 0;
const onPostgres = async (slots: number, keyed: boolean) => {
  const limiter = createPostgresConcurrencyLimiter({
    db: pool,
    name: `fairness-${++n}`,
    maxConcurrent: slots,
  });
  try {
    return await run(limiter, slots, keyed);
  } finally {
    await limiter.close();
  }
};
for (const slots of slotCounts) {
  const fifo = await onPostgres(slots, false);
  const fair = await onPostgres(slots, true);
  rows.push({
    kind: 'postgres',
    slots,
    fifo: fifo.before,
    fair: fair.before,
    fifoMs: fifo.ms,
    fairMs: fair.ms,
  });
}
// The limiters are closed: end the pool and wait for its sockets to close before the drop.
await endPool(pool);
await admin.query('DROP DATABASE IF EXISTS sluice_bench_fairness WITH (FORCE)');
await admin.query('DROP DATABASE IF EXISTS sluice_bench_fairness_queue WITH (FORCE)');
await admin.query('CREATE DATABASE sluice_bench_fairness_queue');
const queue = await defaultQueue(urlOf(server, 'sluice_bench_fairness_queue'));
await admin.query('DROP DATABASE IF EXISTS sluice_bench_fairness_queue WITH (FORCE)');
await admin.end();

console.log(
  `\nKey A asks for ${burst.toLocaleString('en')} slots at once, then key B asks once: A's grants before B's`,
);
console.log(`node ${process.version}, ${new Date().toISOString().slice(0, 10)}\n`);
const header = ['limiter', 'slots', 'FIFO (no keys)', 'fair (keys)', 'FIFO run', 'fair run'];
const cells = rows.map((r) => [
  r.kind,
  String(r.slots),
  String(r.fifo),
  String(r.fair),
  `${r.fifoMs.toFixed(0)} ms`,
  `${r.fairMs.toFixed(0)} ms`,
]);
const widths = header.map((_, i) => Math.max(...[header, ...cells].map((row) => row[i]!.length)));
const line = (row: string[]) => `| ${row.map((cell, i) => cell.padEnd(widths[i]!)).join(' | ')} |`;
console.log(line(header));
console.log(`|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`);
for (const row of cells) console.log(line(row));
console.log(
  `\nServer, default-class queue: tenant A with ${queue.queued} runs queued (one more running), then B queues one: ` +
    `A's claims before B's ${queue.claimsBeforeB} (arrival order: ${queue.queued + 1}); one claim ${queue.claimMs.toFixed(2)} ms`,
);

// The headline keys: one slot, the worst case across the two limiters.
const one = rows.filter((r) => r.slots === 1);
const of = (kind: Row['kind'], slots: number) => rows.find((r) => r.kind === kind && r.slots === slots)!;
console.log(
  JSON.stringify({
    bench: 'fairness',
    active_keys: 2,
    burst,
    fifo_grants_before_b: Math.max(...one.map((r) => r.fifo)),
    fair_grants_before_b: Math.max(...one.map((r) => r.fair)),
    memory_fifo_grants_before_b: of('memory', 1).fifo,
    memory_fair_grants_before_b: of('memory', 1).fair,
    postgres_fifo_grants_before_b: of('postgres', 1).fifo,
    postgres_fair_grants_before_b: of('postgres', 1).fair,
    default_queue_claims_before_b: queue.claimsBeforeB,
    default_queue_claim_ms: Number(queue.claimMs.toFixed(2)),
    fair_grants_before_b_by_slots: Object.fromEntries(
      slotCounts.map((s) => [s, Math.max(of('memory', s).fair, of('postgres', s).fair)]),
    ),
  }),
);
