import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { describe, expect, inject, it } from 'vitest';
import { urlOf } from '../scripts/postgres-config.js';

const root = fileURLToPath(new URL('../', import.meta.url));
const postgres = inject('postgres');
const redis = inject('redis');

/**
 * Every bench at its smallest setting, run as a user runs it (`npm run bench:NAME`): it must
 * end by itself with code 0 once its last line is printed, and drop the databases it made.
 * bench:capacity has its own test (packages/postgres/test/bench-capacity.test.ts), and
 * bench:gateway too (packages/server/test/gateway/bench.test.ts). The benches are split over
 * three test files (benches-end*.test.ts), about three minutes each, so that the test run's
 * workers take them side by side instead of one worker taking all nine in a row.
 */
const benches: { script: string; args: string[]; json?: string; databases?: string }[] = [
  { script: 'limiter', args: ['--expose-gc', 'bench/limiter.ts', '--smoke'], json: 'limiter' },
  { script: 'fairness', args: ['bench/fairness.ts'], json: 'fairness', databases: 'sluice_bench_fairness' },
  {
    script: 'postgres',
    args: ['bench/postgres-limiter.ts', '--smoke'],
    json: 'postgres',
    databases: 'sluice_bench_spec|sluice_bench_ours',
  },
  {
    script: 'server',
    args: ['bench/server.ts', '--smoke'],
    json: 'server',
    databases: 'sluice_bench_server',
  },
  {
    script: 'queues',
    args: ['bench/queues.ts', '--smoke'],
    json: 'queues',
    databases: 'sluice_bench_queues_PID_%',
  },
  { script: 'cache', args: ['bench/cache.ts', '--smoke'], json: 'cache', databases: 'sluice_bench_cache' },
  {
    script: 'stream',
    args: ['bench/stream.ts', '--smoke'],
    json: 'stream',
    databases: 'sluice_bench_stream_PID',
  },
  { script: 'agent', args: ['bench/agent-overhead.ts', '--quick'] },
  { script: 'memory', args: ['bench/agent-memory.ts'] },
];

const limitMs = 300_000;

async function run(
  args: string[],
): Promise<{ code: number | null; signal: string | null; output: string; pid: number }> {
  const { database, ...server } = postgres!;
  const env: NodeJS.ProcessEnv = { ...process.env, DATABASE_URL: urlOf(server, database) };
  if (redis) env.REDIS_URL = redis;
  for (const key of Object.keys(env)) if (key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
  const flags = args[0] === '--expose-gc' ? [args.shift()!] : [];
  const child = spawn(
    process.execPath,
    [...flags, '--conditions=@sluice/source', '--import', 'tsx', ...args],
    {
      cwd: root,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  return { code, signal, output, pid: child.pid! };
}

/** The suite for the benches named (bench:NAME), in the order given. */
export function describeBenchesEnd(names: string[]): void {
  const chosen = names.map((name) => {
    const bench = benches.find((b) => b.script === name);
    if (!bench) throw new Error(`no bench named ${name}`);
    return bench;
  });
  describe.runIf(postgres && redis)('every bench ends by itself', () => {
    for (const bench of chosen) {
      it(
        `npm run bench:${bench.script} at its smallest setting exits 0 after its last line`,
        async () => {
          const { code, signal, output, pid } = await run([...bench.args]);
          expect({ code, signal, output: code === 0 ? '' : output }).toEqual({
            code: 0,
            signal: null,
            output: '',
          });
          const last = output.trimEnd().split('\n').at(-1)!;
          if (bench.json) expect((JSON.parse(last) as { bench: string }).bench).toBe(bench.json);
          else expect(last.trim().length).toBeGreaterThan(0);
          if (!bench.databases) return;
          const { database, ...server } = postgres!;
          const admin = new pg.Client({ ...server, database });
          await admin.connect();
          try {
            const left = await admin.query('SELECT datname FROM pg_database WHERE datname SIMILAR TO $1', [
              bench.databases.replace('PID', String(pid)), // bench:queues names its databases by its pid
            ]);
            expect(left.rows).toEqual([]);
          } finally {
            await admin.end();
          }
        },
        limitMs,
      );
    }
  });
}
