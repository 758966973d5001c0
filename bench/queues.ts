/**
 * Sluice against the job queues a team would otherwise build on, in one run on one PostgreSQL
 * 15: a Fastify route calling graphile-worker's `addJob` or pg-boss's `send`, and their workers
 * calling the model. Each system's server runs in a process of its own (Sluice's on the
 * packages' build, as users run it), the load generator (autocannon) in another, the model
 * provider (the testkit's stand-in) in a third; every system gets a fresh database per
 * measure, and 16 queue workers.
 *
 *   - enqueue: POSTs that queue a run (Sluice: a deferred run, tenant caps on), 32 and 256
 *     clients, requests/s and p50/p99, the workers held by a stalled model;
 *   - end to end: runs/s from the first POST to the last run's end, for 5,000 runs whose model
 *     call answers in 0 ms and in 200 ms;
 *   - under a cap: the same at 200 ms with a running cap of 10 per tenant, one tenant sending
 *     seven runs in eight (its share of 16 workers is 14). Sluice's deferred cap against each
 *     peer's nearest feature (serial lanes: graphile-worker's `queueName`, pg-boss's singleton
 *     key, 10 lanes per tenant). For each: the most runs of that tenant open at once in its
 *     database (queued or running: past 10, the cap decided something), the stand-in's highest
 *     in-flight count for it and for any tenant, whether every tenant kept to 10, and whether
 *     that tenant reached 10 (a cap kept by running fewer is not the cap).
 *
 * Beside each rate, the CPU time the system's server process used per request (enqueue) or per
 * run (end to end), read from the process itself over the measured span, and PostgreSQL's over
 * the same span when it runs on this machine (queues/postgres-cpu.ts): at 0 ms the measure is
 * bound by the two cores that every process shares, so these say where a run's cost goes.
 * While a measure runs, the bench asks each system's database every 10 ms how many runs are
 * open, reading its open runs only (systems.ts `open`).
 *
 * Ratios are Sluice's figure over the best peer's in the same run. Last line: JSON
 * `{"bench":"queues","enqueue_vs_best_peer":…,"end_to_end_vs_best_peer":…,"capped_vs_best_peer":…}`
 * (the first two the worse of their two settings).
 *
 * Run: npm run bench:queues   (-- --quick: 256 enqueues at 32 clients, 200 runs, 0 and 50 ms
 *   models, the cap at 200 ms;
 *   -- --smoke: the same with 50 runs and a 0 ms model only). BENCH_CPU_PROF_DIR=dir: every
 *   process of the bench but this one writes a CPU profile there as it exits.
 */
import { loadavg } from 'node:os';
import pg from 'pg';
import { buildPackages } from '../scripts/build-packages.js';
import { serverOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';
import { startChild } from './queues/child.js';
import {
  dropDatabase,
  endToEnd,
  enqueue,
  type Bench,
  type EndToEndFigures,
  type EnqueueFigures,
} from './queues/phases.js';
import {
  capBinding,
  endToEndRows,
  enqueueRows,
  keptCap,
  reachedCap,
  SLUICE,
  table,
  versusBest,
} from './queues/report.js';
import { systems } from './queues/systems.js';

// --smoke: the smallest setting, for the test that the bench ends (its figures mean little).
const smoke = process.argv.includes('--smoke');
const quick = smoke || process.argv.includes('--quick');
const clientCounts = quick ? [32] : [32, 256];
const enqueueSeconds = 5;
// Quick: a number of requests rather than a time, so that a busy machine still gives figures.
const enqueueLength = quick
  ? { warmUp: { amount: 64 }, measured: { amount: 256 } }
  : { warmUp: { seconds: 1 }, measured: { seconds: enqueueSeconds } };
const runs = smoke ? 50 : quick ? 200 : 5_000;
const delays = smoke ? [0] : quick ? [0, 50] : [0, 200];
// Under the cap the model answers in 200 ms (smoke: 0 ms), so that a tenant's runs pile up
// past its cap even on a slow machine.
const cappedDelay = smoke ? 0 : 200;
const cap = 10;
const workers = 16;
const timeoutMs = quick ? 30_000 : 180_000;
const tenants = Array.from({ length: 8 }, (_, i) => `tenant-${i}`);
// Under the cap: tenant-0 sends seven runs in eight, so its share of 16 workers (14) passes 10.
const skewedTenants = tenants.slice(0, 8);
const skewed = skewedTenants.slice(1).flatMap((t) => [...Array<string>(7).fill('tenant-0'), t]);

// The processes measured run the packages' build, as users run them (queues/child.ts).
buildPackages();
const url = (await ensurePostgres()) as string | undefined;
if (!url) throw new Error('No PostgreSQL server found or startable');
const { server, database } = serverOf(url);
const admin = new pg.Client({ ...server, database });
await admin.connect();
const standIn = startChild('./stand-in.ts', {});
const load = startChild('./load.ts', {});
const providerUrl = String((await standIn.ready).url);
await load.ready;
const bench: Bench = {
  server,
  admin,
  standIn,
  providerUrl,
  load,
  prefix: `sluice_bench_queues_${process.pid}`,
  workers,
};
const loadAtStart = loadavg()[0]!;
const began = Date.now();

/** Each measure as it ends, on stderr: a run on a busy machine shows where its time goes. */
function progress<T extends object>(what: string, figures: T): T {
  const seconds = ((Date.now() - began) / 1000).toFixed(0);
  console.error(`bench:queues ${seconds} s: ${what}: ${JSON.stringify(figures)}`);
  return figures;
}

const enqueued = new Map<number, Map<string, EnqueueFigures>>();
const ended = new Map<number, Map<string, EndToEndFigures>>();
const capped = new Map<string, EndToEndFigures>();
try {
  // The first measure of a run meets a cold machine (PostgreSQL's caches and the load
  // generator new): one short enqueue per system first, not counted, so that no system pays for
  // being measured first. The smallest setting goes straight on.
  if (!smoke)
    for (const [i, system] of systems.entries())
      await enqueue(bench, system, i, tenants, clientCounts[0]!, {
        warmUp: { amount: 64 },
        measured: { amount: 256 },
      });
  for (const clients of clientCounts) {
    const by = new Map<string, EnqueueFigures>();
    for (const [i, system] of systems.entries())
      by.set(
        system.name,
        progress(
          `enqueue, ${system.name}, ${clients} clients`,
          await enqueue(bench, system, i, tenants, clients, enqueueLength),
        ),
      );
    enqueued.set(clients, by);
  }
  for (const delayMs of delays) {
    const by = new Map<string, EndToEndFigures>();
    for (const [i, system] of systems.entries()) {
      const options = { tenants, pattern: tenants, tenantCap: 0, runs, delayMs, timeoutMs };
      by.set(
        system.name,
        progress(`end to end, ${system.name}, ${delayMs} ms`, await endToEnd(bench, system, i, options)),
      );
    }
    ended.set(delayMs, by);
  }
  for (const [i, system] of systems.entries()) {
    const options = {
      tenants: skewedTenants,
      pattern: skewed,
      tenantCap: cap,
      runs,
      delayMs: cappedDelay,
      timeoutMs,
    };
    capped.set(
      system.name,
      progress(`under the cap, ${system.name}`, await endToEnd(bench, system, i, options)),
    );
  }
} finally {
  for (const i of systems.keys()) await dropDatabase(bench, `${bench.prefix}_${i}`);
  await admin.end();
  await load.stop();
  await standIn.stop();
}

console.log(
  `\nSluice against job queues on one PostgreSQL 15, ${workers} workers, one run; node ${process.version}, ${new Date().toISOString().slice(0, 10)}`,
);
console.log(
  `\nEnqueue: POST one run, ${quick ? '256 requests after 64' : `${enqueueSeconds} s after 1 s`} of warm-up`,
);
console.log(
  table(
    [
      'system',
      'clients',
      'requests/s',
      'p50 ms',
      'p99 ms',
      'server CPU µs/request',
      'PostgreSQL CPU µs/request',
      'ratio',
    ],
    [...enqueued].flatMap(([clients, by]) => enqueueRows(clients, by)),
  ),
);
console.log(`\nEnd to end: ${runs} runs by 32 clients, from the first POST to the last run's end`);
const endHeader = [
  'system',
  'model answers in',
  'runs done',
  'seconds',
  'runs/s',
  'server CPU µs/run',
  'PostgreSQL CPU µs/run',
  'ratio',
];
console.log(
  table(
    endHeader,
    [...ended].flatMap(([delay, by]) => endToEndRows(`${delay} ms`, by)),
  ),
);
console.log(
  `\nUnder a running cap of ${cap} per tenant (tenant-0 sends 7 runs in 8), model ${cappedDelay} ms`,
);
console.log(
  table(
    [
      ...endHeader,
      'tenant-0 open at most',
      'tenant-0 in flight at most',
      'any tenant in flight at most',
      `kept ${cap}`,
      `reached ${cap}`,
    ],
    endToEndRows(`${cappedDelay} ms`, capped, cap),
  ),
);
const notBinding = [...capped].filter(([, f]) => !capBinding(f, cap)).map(([n]) => n);
if (notBinding.length > 0)
  console.log(
    `\nThe cap decided nothing for ${notBinding.join(', ')}: tenant-0 never had more than ${cap} runs open at once there, so this run does not test that cap.`,
  );
console.log(
  `\nratio: Sluice's rate over the best peer's (on Sluice's row), a peer's over Sluice's (on its own); load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0]!.toFixed(1)} at the end (2-core machine)`,
);

const roundOrNull = (us: number | undefined) => (us === undefined ? null : Math.round(us));
const rate = (by: Map<string, EnqueueFigures | EndToEndFigures>) =>
  versusBest(new Map([...by].map(([n, f]) => [n, 'rps' in f ? f.rps : f.rate]))).ratio;
const enqueueRatios = Object.fromEntries(
  [...enqueued].map(([c, by]) => [`enqueue_${c}_vs_best_peer`, rate(by)]),
);
const endRatios = Object.fromEntries(
  [...ended].map(([d, by]) => [`end_to_end_${d}ms_vs_best_peer`, rate(by)]),
);
const exactPeers = new Map([...capped].filter(([name, f]) => name === SLUICE || keptCap(f, cap)));
console.log(
  JSON.stringify({
    bench: 'queues',
    enqueue_vs_best_peer: Math.min(...Object.values(enqueueRatios)),
    end_to_end_vs_best_peer: Math.min(...Object.values(endRatios)),
    capped_vs_best_peer: rate(capped),
    capped_vs_best_exact_peer: exactPeers.size > 1 ? rate(exactPeers) : null,
    ...enqueueRatios,
    ...endRatios,
    cap_kept: Object.fromEntries([...capped].map(([n, f]) => [n, keptCap(f, cap)])),
    cap_reached: Object.fromEntries([...capped].map(([n, f]) => [n, reachedCap(f, cap)])),
    cap_binding: Object.fromEntries([...capped].map(([n, f]) => [n, capBinding(f, cap)])),
    runs,
    workers,
    sluice_enqueue_rps: Object.fromEntries(
      [...enqueued].map(([c, by]) => [c, Math.round(by.get(SLUICE)!.rps)]),
    ),
    // The server process's CPU per request (enqueue) and per run (end to end), each system's: a
    // figure a busy shared machine disturbs less than a rate.
    server_cpu_us: {
      ...Object.fromEntries(
        [...enqueued].map(([c, by]) => [
          `enqueue_${c}`,
          Object.fromEntries([...by].map(([n, f]) => [n, Math.round(f.cpuUs)])),
        ]),
      ),
      ...Object.fromEntries(
        [...ended].map(([d, by]) => [
          `end_to_end_${d}ms`,
          Object.fromEntries([...by].map(([n, f]) => [n, Math.round(f.cpuUs)])),
        ]),
      ),
    },
    // PostgreSQL's CPU per request and per run in the same measures (null: not on this machine).
    postgres_cpu_us: {
      ...Object.fromEntries(
        [...enqueued].map(([c, by]) => [
          `enqueue_${c}`,
          Object.fromEntries([...by].map(([n, f]) => [n, roundOrNull(f.postgresCpuUs)])),
        ]),
      ),
      ...Object.fromEntries(
        [...ended].map(([d, by]) => [
          `end_to_end_${d}ms`,
          Object.fromEntries([...by].map(([n, f]) => [n, roundOrNull(f.postgresCpuUs)])),
        ]),
      ),
    },
    load_avg_start: Number(loadAtStart.toFixed(1)),
    load_avg_end: Number(loadavg()[0]!.toFixed(1)),
  }),
);
