/**
 * Held-run admission with the Redis cache store against the memory one, on this machine, in
 * one run: inline runs (`POST /agents/echo/runs`, held until the answer) through the HTTP
 * server, 32 concurrent clients of one user, the stand-in model answering at once. Every run
 * takes and gives back a place of the user's cap (runs.maxConcurrentPerUser 64, so none is
 * refused); a good token costs the failed-auth limiter nothing.
 *
 * The two stores take turns (memory, Redis, memory, Redis) on one server database, so drift of
 * the machine during the run lands on both. Store: PostgreSQL when one can be found or
 * started (what several processes would share), else embedded PGlite. Redis: REDIS_URL, else
 * a redis-server started here on a free port, without persistence.
 * Run: npm run bench:cache   (-- --quick; -- --smoke, the shortest)
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import pg from 'pg';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';
import { serverOf, urlOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';

// --smoke: the smallest setting, for the test that the bench ends (its figures mean little).
const smoke = process.argv.includes('--smoke');
const quick = smoke || process.argv.includes('--quick');
const seconds = smoke ? 0.5 : quick ? 2 : 5;
const rounds = 2;
const concurrency = 32;

async function load(request: () => Promise<number>) {
  const latencies: number[] = [];
  let wrong = 0;
  const end = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        const start = performance.now();
        const status = await request();
        latencies.push(performance.now() - start);
        if (status !== 200) wrong++;
      }
    }),
  );
  return { latencies, wrong };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

/** REDIS_URL, or a redis-server of our own; its URL and how to stop it. */
async function startRedis(): Promise<{ url: string; stop(): void }> {
  if (process.env.REDIS_URL) return { url: process.env.REDIS_URL, stop: () => undefined };
  if (!existsSync('/usr/bin/redis-server')) throw new Error('Set REDIS_URL or install redis-server');
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-redis-'));
  const port = await freePort();
  const child = spawn(
    '/usr/bin/redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    { stdio: 'ignore' },
  );
  const url = `redis://127.0.0.1:${port}/9`;
  const stop = () => {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  for (let i = 0; i < 100; i++) {
    const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0 });
    try {
      await client.connect();
      await client.ping();
      client.disconnect();
      return { url, stop };
    } catch {
      client.disconnect();
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  stop();
  throw new Error('redis-server did not start');
}

const redis = await startRedis();
const flush = new Redis(redis.url);
await flush.flushdb();
flush.disconnect();

let databaseUrl = '';
let storeName = 'PGlite';
const pgUrl = (await ensurePostgres()) as string | undefined;
if (pgUrl) {
  const admin = new pg.Client({ connectionString: pgUrl });
  await admin.connect();
  await admin.query('DROP DATABASE IF EXISTS sluice_bench_cache WITH (FORCE)');
  await admin.query('CREATE DATABASE sluice_bench_cache');
  await admin.end();
  databaseUrl = urlOf(serverOf(pgUrl).server, 'sluice_bench_cache');
  storeName = 'PostgreSQL';
}

const provider = await startProviderStandIn({ reply: () => ({ text: 'ok' }) });
const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
const dataDir = mkdtempSync(join(tmpdir(), 'sluice-bench-cache-'));
const results = { memory: [] as number[], redis: [] as number[] };
const wrong = { memory: 0, redis: 0 };
const runs = { memory: 0, redis: 0 };

for (let round = 0; round < rounds; round++) {
  for (const cacheStore of ['memory', 'redis'] as const) {
    const server = await serve({
      config: defineConfig({
        agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) },
        runs: { maxConcurrentPerUser: 64 },
        settings: { maxActivePerTenant: 1000 },
        cacheStore,
        ...(cacheStore === 'redis' && { redisUrl: redis.url }),
      }),
      port: 0,
      dataDir,
      databaseUrl,
      logger: false,
    });
    const token = (
      await createToken(server.store.db, { tenant: 'bench', project: 'p', user: 'u', role: 'member' })
    ).secret;
    const headers = { 'content-type': 'application/json', authorization: `Bearer ${token}` };
    const post = () =>
      fetch(`${server.url}/api/client/v1/agents/echo/runs`, {
        method: 'POST',
        headers,
        body: '{"input":"hi"}',
      }).then(async (r) => (await r.arrayBuffer(), r.status));
    for (let i = 0; i < 50; i++) await post(); // warm-up
    const r = await load(post);
    results[cacheStore].push(...r.latencies);
    runs[cacheStore] += r.latencies.length;
    wrong[cacheStore] += r.wrong;
    await server.close();
  }
}
await provider.close();
redis.stop();
rmSync(dataDir, { recursive: true, force: true });
if (pgUrl) {
  const admin = new pg.Client({ connectionString: pgUrl });
  await admin.connect();
  await admin.query('DROP DATABASE IF EXISTS sluice_bench_cache WITH (FORCE)');
  await admin.end();
}

const summary = (name: 'memory' | 'redis') => {
  const sorted = results[name].sort((a, b) => a - b);
  return {
    rps: runs[name] / (seconds * rounds),
    p50: sorted[Math.floor(sorted.length / 2)]!,
    p99: sorted[Math.floor(sorted.length * 0.99)]!,
  };
};
const memory = summary('memory');
const shared = summary('redis');
const ratio = shared.rps / memory.rps;

console.log(
  `\nHeld-run admission (inline runs, stand-in model), ${concurrency} clients, ${rounds} x ${seconds} s per store, ${storeName}`,
);
console.log(`node ${process.version}, ${new Date().toISOString().slice(0, 10)}\n`);
const header = ['cache store', 'runs/s', 'p50 ms', 'p99 ms', 'vs memory'];
const rows = [
  ['memory', memory.rps.toFixed(0), memory.p50.toFixed(2), memory.p99.toFixed(2), '1.00x'],
  ['redis', shared.rps.toFixed(0), shared.p50.toFixed(2), shared.p99.toFixed(2), `${ratio.toFixed(2)}x`],
];
const widths = header.map((_, i) => Math.max(...[header, ...rows].map((r) => r[i]!.length)));
const line = (r: string[]) => `| ${r.map((c, i) => c.padEnd(widths[i]!)).join(' | ')} |`;
console.log(line(header));
console.log(`|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`);
for (const r of rows) console.log(line(r));
for (const name of ['memory', 'redis'] as const)
  if (wrong[name] > 0) console.warn(`${name}: ${wrong[name]} answers other than 200`);
console.log(
  JSON.stringify({
    bench: 'cache',
    redis_vs_memory: Number(ratio.toFixed(3)),
    node: process.version,
    store: storeName,
    clients: concurrency,
    seconds_per_store: seconds * rounds,
    memory: {
      rps: Number(memory.rps.toFixed(1)),
      p50_ms: Number(memory.p50.toFixed(3)),
      p99_ms: Number(memory.p99.toFixed(3)),
    },
    redis: {
      rps: Number(shared.rps.toFixed(1)),
      p50_ms: Number(shared.p50.toFixed(3)),
      p99_ms: Number(shared.p99.toFixed(3)),
    },
    answers_not_200: wrong,
  }),
);
