import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../../../', import.meta.url));

it('npm run bench:gateway at its smallest setting ends by itself with code 0 and the JSON last line', async () => {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
  const child = spawn(
    process.execPath,
    ['--conditions=@sluice/source', '--import', 'tsx', 'bench/gateway.ts', '--quick'],
    { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  expect({ code, signal, output: code === 0 ? '' : output }).toEqual({ code: 0, signal: null, output: '' });
  const last = JSON.parse(output.trimEnd().split('\n').at(-1)!) as Record<string, unknown>;
  expect(last.bench).toBe('gateway');
  for (const field of ['added_p50_ms', 'added_p99_ms', 'throughput_vs_direct', 'per_chunk_added_us'])
    expect(typeof last[field], field).toBe('number');
  expect(last.throughput_vs_direct as number).toBeGreaterThan(0);
  expect(output).toContain('per streamed chunk');
}, 240_000);
