import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { publint } from 'publint';
import { formatMessage } from 'publint/utils';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer } from '../../server/test/helpers.js';

// @sluice/client as a user gets it: packed, installed alone into a folder outside the
// repository (no workspace, no other @sluice package, no tsx, no source condition), imported
// from plain Node ESM against a real server, and type-checked by tsc as a user's project would.

const root = fileURLToPath(new URL('../../../', import.meta.url));
const tsc = join(root, 'node_modules/typescript/bin/tsc');
const scratch = mkdtempSync(join(tmpdir(), 'sluice-client-package-'));
const app = join(scratch, 'app');
afterAll(() => rm(scratch, { recursive: true, force: true }), 60_000);

/** A user's shell: nothing npm or vitest set for this run (a nested npm would find the repository). */
function userEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of Object.keys(env))
    if (key.startsWith('npm_') || key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
  return env;
}

/** Runs a command to completion: its exit code and output. */
async function run(command: string, args: string[], cwd: string) {
  const child = spawn(command, args, { cwd, env: userEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, output };
}

async function ok(command: string, args: string[], cwd: string): Promise<string> {
  const { code, output } = await run(command, args, cwd);
  if (code !== 0) throw new Error(`${command} ${args.join(' ')} exited with ${code}:\n${output}`);
  return output;
}

describe('@sluice/client, packed and installed alone outside the repository', () => {
  beforeAll(async () => {
    // The client alone: it references no other package.
    await ok(process.execPath, [tsc, '-b', 'packages/client/tsconfig.build.json'], root);
    const tarballs = join(scratch, 'tarballs');
    mkdirSync(tarballs);
    await ok(
      'npm',
      ['pack', '-w', 'packages/client', '--ignore-scripts', '--pack-destination', tarballs],
      root,
    );
    expect(readdirSync(tarballs)).toEqual(['sluice-client-0.1.0.tgz']);
    const file = join(tarballs, 'sluice-client-0.1.0.tgz');
    const tarball = readFileSync(file);
    const { messages, pkg } = await publint({
      pack: { tarball: tarball.buffer.slice(tarball.byteOffset, tarball.byteOffset + tarball.byteLength) },
      strict: true,
    });
    expect(messages.map((m) => formatMessage(m, pkg))).toEqual([]);
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ private: true, type: 'module' }));
    await ok('npm', ['install', file, '--prefer-offline', '--no-audit', '--no-fund'], app);
  }, 300_000);

  it('has no runtime dependency: the install is the package alone', () => {
    expect(readdirSync(join(app, 'node_modules')).filter((n) => !n.startsWith('.'))).toEqual(['@sluice']);
    expect(readdirSync(join(app, 'node_modules/@sluice'))).toEqual(['client']);
  });

  it('plain Node ESM imports it and runs, streams and reads a run on a real server', async () => {
    const t = await startTestServer();
    writeFileSync(
      join(app, 'use.mjs'),
      `import { createClient, SluiceError, RateLimitError } from '@sluice/client';
const [baseUrl, token] = process.argv.slice(2);
const sluice = createClient({ baseUrl, token });
const created = await sluice.runs.create('echo', { input: 'packed' });
const events = [];
for await (const e of sluice.runs.stream('echo', { input: 'streamed' })) events.push(e.event);
const missing = await sluice.runs.get('run_000000000000000000000000').catch((e) => e);
console.log(JSON.stringify({
  status: created.status,
  text: created.output.text,
  events,
  missing: [missing instanceof SluiceError, missing.status],
  rateLimitIsSluice: new RateLimitError(429, {}) instanceof SluiceError,
}));
`,
    );
    const output = await ok(process.execPath, ['use.mjs', t.server.url, t.admin], app);
    expect(JSON.parse(output.trim().split('\n').at(-1)!)).toEqual({
      status: 'succeeded',
      text: 'done packed',
      events: ['run.created', 'run.started', 'message.delta', 'run.completed'],
      missing: [true, 404],
      rateLimitIsSluice: true,
    });
  });

  it('tsc type-checks a user file against its declarations (nodenext, bundler and node10 resolution)', async () => {
    writeFileSync(
      join(app, 'use.ts'),
      `import { createClient, RateLimitError, type Run, type StreamEvent } from '@sluice/client';
const sluice = createClient({ baseUrl: 'http://127.0.0.1:8787', token: 't' });
export async function main(): Promise<Run> {
  for await (const e of sluice.runs.stream('writer', { input: 'tides' })) {
    const event: StreamEvent = e;
    if (event.event === 'message.delta') console.log(event.data.text);
  }
  // @ts-expect-error: not a field of a run's body
  await sluice.runs.create('writer', { input: 'x', not_a_field: 1 });
  const error = new RateLimitError(429, {});
  const ms: number | undefined = error.retryAfterMs;
  void ms;
  return sluice.runs.wait('run_1');
}
`,
    );
    const common = ['--noEmit', '--strict', '--target', 'es2022', '--lib', 'es2022,dom,dom.asynciterable'];
    for (const [module, resolution] of [
      ['nodenext', 'nodenext'],
      ['esnext', 'bundler'],
      ['commonjs', 'node10'],
    ] as const) {
      const { code, output } = await run(
        process.execPath,
        [tsc, ...common, '--module', module, '--moduleResolution', resolution, 'use.ts'],
        app,
      );
      expect({ resolution, code, output }).toEqual({ resolution, code: 0, output: '' });
    }
  }, 120_000);
});
