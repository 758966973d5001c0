/**
 * Cost of one grant (acquire + release) with N requests already waiting, for the Sluice
 * in-memory limiter (three prioritised workloads; and one workload shared fairly by 100 keys)
 * and, doing the same work in the same process:
 *
 * - a floor: N bare pending promises resolved in arrival order (an array and a head index,
 *   no limiter at all): what holding that many waiters costs the engine by itself;
 * - p-queue with priorities (three priority levels, like three workloads);
 * - p-limit (first in, first out, no priorities).
 *
 * Each round holds the only slot, fills the queue to the depth, then lets go: every granted
 * request adds one new request (so the depth stays put) and gives its slot back. The three
 * levels are taken in turn, so a priority queue has to insert in the middle.
 *
 * The last line is one line of JSON: `depth_100k_vs_1k` is Sluice's cost per grant at 100,000
 * waiters over its cost at 1,000 (the issue asks for at most 2), beside the same ratio for the
 * bare promises, which is the floor a queue in JavaScript can reach on this engine.
 *
 * Run: npm run bench:limiter   (add -- --quick for a short run, -- --smoke for the shortest)
 */
import { performance } from 'node:perf_hooks';
import pLimit from 'p-limit';
import PQueue from 'p-queue';
import { createConcurrencyLimiter, type ConcurrencyLease, type ConcurrencyLimiter } from 'sluice/concurrency';

const quick = process.argv.includes('--quick');
// --smoke: the smallest setting, one short run of each, for the test that the bench ends.
const smoke = process.argv.includes('--smoke');
const depths = [1, 1_000, 100_000];
const grants = smoke ? 2_000 : quick ? 20_000 : 100_000;
const repeats = smoke ? 1 : quick ? 3 : 7;
const levels = ['high', 'mid', 'low'] as const;
const priorities = { high: 2, mid: 1, low: 0 } as const;

type Runner = (depth: number, grants: number) => Promise<number>;

/**
 * One Sluice round. Once the last grant is counted, the limiter is emptied: the last lease
 * goes back and the requests still queued are granted and released without asking again. Left
 * as it was, the held lease would expire after `leaseTtlMs` (30 s), the sweep would hand its
 * slot on, and the round's callbacks would go on granting and asking for ever (the bench then
 * never ended, and spun a core).
 */
async function sluiceRound<W extends string>(
  limiter: ConcurrencyLimiter<W>,
  ask: () => Parameters<ConcurrencyLimiter<W>['acquire']>[0],
  depth: number,
  total: number,
): Promise<number> {
  let done = 0;
  let stopped = false;
  let left = 0;
  let last: ConcurrencyLease<W> | undefined;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => (finish = resolve));
  let emptied!: () => void;
  const empty = new Promise<void>((resolve) => (emptied = resolve));
  const onGrant = (lease: ConcurrencyLease<W>) => {
    if (stopped) {
      void limiter.release(lease).then(() => {
        if (--left === 0) emptied();
      });
      return;
    }
    if (++done === total) {
      last = lease;
      return finish();
    }
    enqueue();
    void limiter.release(lease);
  };
  const enqueue = () => void limiter.acquire(ask()).then(onGrant);
  const holder = await limiter.acquire();
  for (let i = 0; i < depth; i++) enqueue();
  const start = performance.now();
  void limiter.release(holder);
  await finished;
  const elapsed = performance.now() - start;
  stopped = true;
  left = depth - 1; // the requests still queued: the last grant asked for no successor
  if (left === 0) emptied();
  await limiter.release(last!);
  await empty;
  const stats = await limiter.stats!();
  if (stats.queued !== 0 || stats.active !== 0) throw new Error('the limiter was not emptied');
  return elapsed;
}

const sluice: Runner = (depth, total) => {
  const limiter = createConcurrencyLimiter({
    maxConcurrent: 1,
    workloads: { high: { priority: 2 }, mid: { priority: 1 }, low: {} },
    defaultWorkload: 'low',
  });
  let k = 0;
  return sluiceRound(limiter, () => ({ workload: levels[k++ % 3] }), depth, total);
};

const sluiceKeys: Runner = (depth, total) => {
  const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
  const keys = Array.from({ length: 100 }, (_, i) => `tenant-${i}`);
  let k = 0;
  return sluiceRound(limiter, () => ({ key: keys[k++ % keys.length] }), depth, total);
};

/** The floor: pending promises in an array, resolved in arrival order, nothing else. */
const barePromises: Runner = async (depth, total) => {
  let resolvers: ((() => void) | undefined)[] = [];
  let head = 0;
  let done = 0;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => (finish = resolve));
  const next = () => {
    if (head > 65_536 && head * 2 > resolvers.length) {
      resolvers = resolvers.slice(head);
      head = 0;
    }
    const resolve = resolvers[head];
    resolvers[head++] = undefined;
    resolve!();
  };
  const onGrant = () => {
    if (++done === total) return finish();
    enqueue();
    next();
  };
  const enqueue = () => void new Promise<void>((resolve) => resolvers.push(resolve)).then(onGrant);
  for (let i = 0; i < depth; i++) enqueue();
  const start = performance.now();
  next();
  await finished;
  return performance.now() - start;
};

const pQueue: Runner = async (depth, total) => {
  const queue = new PQueue({ concurrency: 1, autoStart: false });
  let k = 0;
  let done = 0;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => (finish = resolve));
  const task = async () => {
    if (++done === total) {
      queue.pause();
      return finish();
    }
    enqueue();
  };
  const enqueue = () => void queue.add(task, { priority: priorities[levels[k++ % 3]!] });
  for (let i = 0; i < depth; i++) enqueue();
  const start = performance.now();
  queue.start();
  await finished;
  const elapsed = performance.now() - start;
  queue.clear();
  return elapsed;
};

const pLimitRunner: Runner = async (depth, total) => {
  const limit = pLimit(1);
  let done = 0;
  let stopped = false;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => (finish = resolve));
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const task = async () => {
    if (stopped) return;
    if (++done === total) {
      stopped = true;
      limit.clearQueue();
      return finish();
    }
    enqueue();
  };
  const enqueue = () => void limit(task);
  void limit(() => gate); // holds the only slot while the queue fills
  for (let i = 0; i < depth; i++) enqueue();
  const start = performance.now();
  release();
  await finished;
  return performance.now() - start;
};

const runners: [string, Runner][] = [
  ['sluice (3 workloads, priorities)', sluice],
  ['sluice (1 workload, 100 keys)', sluiceKeys],
  ['bare pending promises (the floor)', barePromises],
  ['p-queue 9.3.5 (3 priorities)', pQueue],
  ['p-limit 7.3.3 (FIFO, no priorities)', pLimitRunner],
];

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

const gc = (globalThis as { gc?: () => void }).gc;
const results = new Map<string, Map<number, number>>();
for (const [name] of runners) results.set(name, new Map());

// Warm up every runner, then measure round-robin so that machine noise falls on all alike.
for (const [, run] of runners) await run(1_000, smoke ? 2_000 : 20_000);
for (const depth of depths) {
  const samples = new Map<string, number[]>(runners.map(([name]) => [name, []]));
  for (let r = 0; r < repeats; r++) {
    for (const [name, run] of runners) {
      gc?.();
      const ms = await run(depth, grants);
      samples.get(name)!.push((ms * 1e6) / grants);
    }
  }
  for (const [name] of runners) results.get(name)!.set(depth, median(samples.get(name)!));
}

const fmt = (ns: number) => `${ns.toFixed(0)} ns`;
console.log(
  `\nCost of one grant (acquire + release), median of ${repeats} runs of ${grants.toLocaleString('en')} grants`,
);
console.log(`node ${process.version}, ${new Date().toISOString().slice(0, 10)}\n`);
const header = ['limiter', ...depths.map((d) => `${d.toLocaleString('en')} waiting`), '100k / 1k'];
const rows = runners.map(([name]) => {
  const r = results.get(name)!;
  return [name, ...depths.map((d) => fmt(r.get(d)!)), `${(r.get(100_000)! / r.get(1_000)!).toFixed(2)}x`];
});
const mine = results.get(runners[0]![0])!;
const keyed = results.get(runners[1]![0])!;
const floor = results.get(runners[2]![0])!;
const base = results.get(runners[3]![0])!;
rows.push(['sluice / p-queue', ...depths.map((d) => `${(mine.get(d)! / base.get(d)!).toFixed(2)}x`), '']);
rows.push([
  'sluice / bare promises',
  ...depths.map((d) => `${(mine.get(d)! / floor.get(d)!).toFixed(2)}x`),
  '',
]);
const widths = header.map((_, i) => Math.max(...[header, ...rows].map((row) => row[i]!.length)));
const line = (row: string[]) => `| ${row.map((cell, i) => cell.padEnd(widths[i]!)).join(' | ')} |`;
console.log(line(header));
console.log(`|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`);
for (const row of rows) console.log(line(row));

const ratio = (r: Map<number, number>) => Number((r.get(100_000)! / r.get(1_000)!).toFixed(2));
const ns = (r: Map<number, number>, d: number) => Math.round(r.get(d)!);
console.log(
  JSON.stringify({
    bench: 'limiter',
    depth_100k_vs_1k: ratio(mine),
    keys_depth_100k_vs_1k: ratio(keyed),
    bare_promises_depth_100k_vs_1k: ratio(floor),
    sluice_ns_1k: ns(mine, 1_000),
    sluice_ns_100k: ns(mine, 100_000),
    keys_ns_100k: ns(keyed, 100_000),
    bare_promises_ns_1k: ns(floor, 1_000),
    bare_promises_ns_100k: ns(floor, 100_000),
    sluice_vs_bare_100k: Number((mine.get(100_000)! / floor.get(100_000)!).toFixed(2)),
  }),
);
