import { spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';
import { itWith } from '../../../../scripts/service-suites.js';
import { afterThisTest } from '../harness/index.js';

// The soak as CI runs it: two minutes, a fixed seed, every service the soak's own
// (bench/soak.ts). It passes when the soak's checker finds no violation of any invariant.

const root = fileURLToPath(new URL('../../../../', import.meta.url));
const pgBinaries =
  existsSync('/usr/lib/postgresql') &&
  readdirSync('/usr/lib/postgresql').some((v) => existsSync(`/usr/lib/postgresql/${v}/bin/initdb`));
const installed = (paths: string[]) => paths.some((p) => existsSync(p));

interface SoakLine {
  soak: string;
  seed: number;
  runs: number;
  faults: Record<string, number>;
  refused: Record<string, number>;
  violations: Record<string, number>;
}

function soak(args: string[]): Promise<{ code: number | null; output: string }> {
  const env = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
  const child = spawn(
    process.execPath,
    ['--conditions=@sluice/source', '--import', 'tsx', 'bench/soak.ts', ...args],
    { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  // SIGTERM, not SIGKILL: the soak then stops its PostgreSQL, PgBouncer, Redis and servers.
  afterThisTest(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, output })));
}

itWith({
  PostgreSQL: pgBinaries,
  PgBouncer: installed(['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer']),
  Redis: installed(['/usr/bin/redis-server', '/usr/local/bin/redis-server']),
})(
  'two minutes of mixed runs and faults across three servers: no violation of any invariant',
  async () => {
    const { code, output } = await soak(['--minutes', '2', '--seed', '7', '--clients', '6']);
    const last = output.trim().split('\n').at(-1) ?? '';
    let line: SoakLine | undefined;
    try {
      line = JSON.parse(last) as SoakLine;
    } catch {
      // the assertion below shows the output
    }
    expect(line, output).toBeDefined();
    expect(line!.seed).toBe(7);
    // The soak did soak: runs of every kind were accepted and faults were injected.
    expect(line!.runs, output).toBeGreaterThan(50);
    expect(
      Object.values(line!.faults).reduce((a, b) => a + b, 0),
      output,
    ).toBeGreaterThanOrEqual(3);
    // The caps it checks were reached, not only configured: each refused some calls.
    expect(line!.refused.max_concurrent_per_user, output).toBeGreaterThan(0);
    expect(line!.refused.max_queued_runs, output).toBeGreaterThan(0);
    expect(line!.violations, output).toEqual(
      Object.fromEntries(Object.keys(line!.violations).map((k) => [k, 0])),
    );
    expect(code, output).toBe(0);
  },
  420_000,
);
