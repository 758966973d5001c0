/**
 * The run server's cost per request, against a bare Fastify route that returns a constant,
 * on this machine, in one run: requests per second and p99 latency for
 *
 *   - an admitted deferred run (202: auth, validation, the cap check and the insert),
 *   - an over-cap request (429: auth, validation, the cap check, nothing written),
 *   - the bare Fastify route (the floor: HTTP on loopback and the load generator itself).
 *
 * Store: embedded PGlite, and PostgreSQL too when one can be found or started. For each store the
 * bare route, the admitted run and the refusal take turns in rounds of 500 ms, and each ratio is
 * taken against the bare route's rounds beside it, so a shared machine's changes in load fall on
 * both sides alike. The servers run in a process of their own (bench/server/target.ts), on the
 * packages' build as users run them; this process is the load generator.
 * Run: npm run bench:server   (-- --quick; -- --smoke, the shortest). The last line of output is one line of JSON:
 * admitted_vs_bare and refused_vs_bare are requests/s as a fraction of the bare route's, on
 * PostgreSQL (pglite_* the same on PGlite).
 */
import { loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { buildPackages } from '../scripts/build-packages.js';
import { serverOf, urlOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';
import { startChild } from './queues/child.js';

const smoke = process.argv.includes('--smoke');
const quick = smoke || process.argv.includes('--quick');
const roundMs = smoke ? 250 : 500;
const seconds = smoke ? 0.25 : quick ? 2 : 5;
const rounds = (seconds * 1000) / roundMs;
const concurrency = 32;

/** Requests of one kind over several rounds: their latencies (ms) and the time spent on them. */
interface Sampled {
  latencies: number[];
  ms: number;
  wrong: number;
}
const sampled = (): Sampled => ({ latencies: [], ms: 0, wrong: 0 });

async function load(into: Sampled, request: () => Promise<number>, expected: number, ms: number) {
  const start = performance.now();
  const end = start + ms;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        const t0 = performance.now();
        const status = await request();
        into.latencies.push(performance.now() - t0);
        if (status !== expected) into.wrong++;
      }
    }),
  );
  into.ms += performance.now() - start;
}

function figures(s: Sampled) {
  const sorted = [...s.latencies].sort((a, b) => a - b);
  return {
    rps: (sorted.length * 1000) / s.ms,
    p50: sorted[Math.floor(sorted.length / 2)]!,
    p99: sorted[Math.floor(sorted.length * 0.99)]!,
    wrong: s.wrong,
  };
}

interface Target {
  bareUrl: string;
  runsUrl: string;
  token: string;
}
const startTarget = async (mode: 'admission' | 'isolation', databaseUrl: string) => {
  const child = startChild('../server/target.ts', { mode, databaseUrl });
  return { child, ...((await child.ready) as unknown as Target) };
};

const stores: { name: string; databaseUrl: string }[] = [{ name: 'PGlite', databaseUrl: '' }];
// The processes measured run the packages' build, as users run them (queues/child.ts).
buildPackages();
const url = (await ensurePostgres()) as string | undefined;
if (url) {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query('DROP DATABASE IF EXISTS sluice_bench_server WITH (FORCE)');
  await admin.query('CREATE DATABASE sluice_bench_server');
  await admin.end();
  stores.push({ name: 'PostgreSQL 15', databaseUrl: urlOf(serverOf(url).server, 'sluice_bench_server') });
}

const json = { 'content-type': 'application/json' };
const rows: string[][] = [];
const ratios: Record<string, number> = {};
const loadAtStart = loadavg()[0]!;

for (const store of stores) {
  const target = await startTarget('admission', store.databaseUrl);
  const headers = { ...json, authorization: `Bearer ${target.token}` };
  const post = (body: string) =>
    fetch(target.runsUrl, { method: 'POST', headers, body }).then(
      async (r) => (await r.arrayBuffer(), r.status),
    );
  const bareRequest = () =>
    fetch(target.bareUrl, { method: 'POST', headers: json, body: '{"input":"x"}' }).then(
      async (r) => (await r.arrayBuffer(), r.status),
    );
  // One run that never ends holds the default-class cap of 1, so the next ones get 429.
  await post('{"input":"hold","wait":false}');
  // Short rounds, the three kinds in turn: on a shared machine, load that comes and goes falls on
  // all three alike instead of on whichever ran during it.
  const [bareS, admittedS, refusedS] = [sampled(), sampled(), sampled()];
  for (let round = 0; round < rounds; round++) {
    await load(bareS, bareRequest, 200, roundMs);
    await load(admittedS, () => post('{"input":"later","class":"deferred","wait":false}'), 202, roundMs);
    await load(refusedS, () => post('{"input":"over"}'), 429, roundMs);
  }
  const [floor, admitted, refused] = [figures(bareS), figures(admittedS), figures(refusedS)];
  rows.push([
    'bare Fastify route (constant)',
    `(beside ${store.name})`,
    floor.rps.toFixed(0),
    floor.p50.toFixed(2),
    floor.p99.toFixed(2),
    '1.00x',
  ]);
  const prefix = store.databaseUrl ? '' : 'pglite_';
  ratios[`${prefix}admitted_vs_bare`] = Number((admitted.rps / floor.rps).toFixed(3));
  ratios[`${prefix}refused_vs_bare`] = Number((refused.rps / floor.rps).toFixed(3));
  ratios[`${prefix}bare_rps`] = Math.round(floor.rps);
  for (const [label, r] of [
    ['admitted deferred run (202)', admitted],
    ['over the cap (429)', refused],
  ] as const) {
    rows.push([
      label,
      store.name,
      r.rps.toFixed(0),
      r.p50.toFixed(2),
      r.p99.toFixed(2),
      `${(floor.rps / r.rps).toFixed(2)}x`,
    ]);
    if (r.wrong > 0) console.warn(`${label} on ${store.name}: ${r.wrong} answers with another status`);
  }
  await target.child.stop();
}

// Isolation: interactive (inline, default-class) run latency with an empty deferred queue and
// with 1,000 deferred runs queued, on the same server and store.
const isolationStore = stores.at(-1)!;
const iso = await startTarget('isolation', isolationStore.databaseUrl);
const isoPost = (body: string) =>
  fetch(iso.runsUrl, {
    method: 'POST',
    headers: { ...json, authorization: `Bearer ${iso.token}` },
    body,
  }).then(async (r) => {
    await r.arrayBuffer();
    return r.status;
  });
const interactive = async () => {
  const samples: number[] = [];
  for (let i = 0; i < (smoke ? 10 : quick ? 40 : 200); i++) {
    const start = performance.now();
    if ((await isoPost('{"input":"hello"}')) !== 200) throw new Error('interactive run failed');
    samples.push(performance.now() - start);
  }
  samples.sort((a, b) => a - b);
  return { p50: samples[Math.floor(samples.length / 2)]!, p99: samples[Math.floor(samples.length * 0.99)]! };
};
await interactive(); // warm-up (JIT, pools, plans)
await interactive();
const empty = await interactive();
for (let i = 0; i < (smoke ? 100 : 1000); i += 50) {
  await Promise.all(
    Array.from({ length: 50 }, () => isoPost('{"input":"batch job","class":"deferred","wait":false}')),
  );
}
const { backlog } = await iso.child.request<{ backlog: number }>('backlog');
const loaded = await interactive();
await iso.child.stop();
if (url) {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query('DROP DATABASE IF EXISTS sluice_bench_server WITH (FORCE)');
  await admin.end();
}

console.log(
  `\nRun server against a bare Fastify route, ${concurrency} concurrent clients, ${seconds} s each in rounds of ${roundMs} ms, one run`,
);
console.log(`node ${process.version}, ${new Date().toISOString().slice(0, 10)}\n`);
const header = ['request', 'store', 'requests/s', 'p50 ms', 'p99 ms', 'cost vs bare'];
const widths = header.map((_, i) => Math.max(...[header, ...rows].map((r) => r[i]!.length)));
const line = (r: string[]) => `| ${r.map((c, i) => c.padEnd(widths[i]!)).join(' | ')} |`;
console.log(line(header));
console.log(`|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`);
for (const r of rows) console.log(line(r));

console.log(`\nIsolation (${isolationStore.name}): inline default-class run, one at a time`);
console.log(`| deferred backlog | p50 ms | p99 ms |`);
console.log(`|---|---|---|`);
console.log(`| empty | ${empty.p50.toFixed(2)} | ${empty.p99.toFixed(2)} |`);
console.log(
  `| ${backlog} deferred runs queued or running | ${loaded.p50.toFixed(2)} | ${loaded.p99.toFixed(2)} |`,
);
console.log(`p50 with the backlog / without: ${(loaded.p50 / empty.p50).toFixed(3)}`);
console.log(
  `\nratio = requests/s against the bare route's, measured in the same rounds; load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0]!.toFixed(1)} at the end (2-core machine)`,
);
console.log(
  JSON.stringify({
    bench: 'server',
    ...ratios,
    clients: concurrency,
    seconds,
    load_avg_start: Number(loadAtStart.toFixed(1)),
    load_avg_end: Number(loadavg()[0]!.toFixed(1)),
  }),
);
