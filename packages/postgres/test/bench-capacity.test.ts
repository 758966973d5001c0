import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { expect, it } from 'vitest';
import { urlOf } from '../../../scripts/postgres-config.js';
import { postgresConfig } from './helpers.js';
import { describeWith } from '../../../scripts/service-suites.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));

/** The figures every run of the bench prints, one per configuration and measure. */
const fields = [
  'sluice_429_per_1000',
  'sluice_capacity_used',
  'told_429_per_1000',
  'told_capacity_used',
  'slots_only_429_per_1000',
  'slots_only_capacity_used',
  'no_limiter_429_per_1000',
  'no_limiter_capacity_used',
  'count_after_429_per_1000',
  'count_after_capacity_used',
];

describeWith({ PostgreSQL: postgresConfig })('npm run bench:capacity', () => {
  it('runs every configuration at its smallest setting, ends by itself with code 0 and a JSON last line, and drops its database', async () => {
    const { database, ...server } = postgresConfig!;
    const env: NodeJS.ProcessEnv = { ...process.env, DATABASE_URL: urlOf(server, database) };
    for (const key of Object.keys(env))
      if (key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
    const child = spawn(
      process.execPath,
      ['--conditions=@sluice/source', '--import', 'tsx', 'bench/capacity.ts', '--seconds', '3'],
      { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
    expect({ code, signal, output: code === 0 ? '' : output }).toEqual({ code: 0, signal: null, output: '' });

    const last = JSON.parse(output.trimEnd().split('\n').at(-1)!) as Record<string, unknown>;
    expect(last.bench).toBe('capacity');
    expect(last.seconds_per_configuration).toBe(3);
    for (const field of fields) expect(Object.hasOwn(last, field), field).toBe(true);
    for (const name of ['slots_only', 'no_limiter', 'count_after', 'sluice', 'told']) {
      expect(typeof last[`${name}_429_per_1000`], name).toBe('number');
      // A share of the account's capacity; on a loaded machine a 3 s window may end before any
      // request of a configuration finished (a CI run beside a soak saw 0), so only its range.
      expect(last[`${name}_capacity_used`] as number, name).toBeGreaterThanOrEqual(0);
      expect(last[`${name}_capacity_used`] as number, name).toBeLessThanOrEqual(1.5);
      expect(last[`${name}_requests`] as number, name).toBeGreaterThan(0);
    }
    expect(output).not.toContain(' not run: ');

    const admin = new pg.Client({ ...server, database });
    await admin.connect();
    try {
      const left = await admin.query(
        "SELECT datname FROM pg_database WHERE datname = 'sluice_bench_capacity_' || $1",
        [String(child.pid)],
      );
      expect(left.rows).toEqual([]);
    } finally {
      await admin.end();
    }
  }, 300_000);
});
