import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  renameSync,
  writeFileSync,
} from 'node:fs';
import { rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { publint } from 'publint';
import { formatMessage } from 'publint/utils';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';

// The shipped artefacts, tried the way a user meets them: the `sluice` wrapper as a process
// manager starts it, and the five packages packed, installed from their tarballs into an empty
// folder and started with `npx sluice serve`.

const root = fileURLToPath(new URL('../../../../', import.meta.url));
const bin = join(root, 'packages/server/bin/sluice.js');
const scratch = mkdtempSync(join(tmpdir(), 'sluice-package-test-'));
// The install holds some 20,000 files: removing them takes a while on a busy machine.
afterAll(() => rm(scratch, { recursive: true, force: true }), 120_000);

/**
 * The environment of a user's shell: nothing that npm sets for the script running this test
 * (it would point a nested npm at this repository), no real provider key (the demo must use
 * the local stand-in), no PostgreSQL (the embedded PGlite is what a fresh install uses) and no
 * loader flags of the test runner.
 */
function userEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of Object.keys(env)) {
    if (key.startsWith('npm_') || key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
  }
  delete env.OPENAI_API_KEY;
  delete env.DATABASE_URL;
  return env;
}

interface Cli {
  readonly child: ChildProcess;
  /** The server's URL and the token it printed, once both are out. */
  readonly ready: Promise<{ url: string; token: string }>;
  /** Every process that held its output has exited (with npx, npm, a shell and node). */
  readonly closed: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
}

function startCli(command: string, args: string[], cwd: string): Cli {
  const child = spawn(command, args, { cwd, env: userEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const closed = once(child, 'close').then(([code, signal]) => ({
    code: code as number | null,
    signal: signal as NodeJS.Signals | null,
  }));
  const ready = new Promise<{ url: string; token: string }>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const url = /(http:\/\/127\.0\.0\.1:\d+)/.exec(output)?.[1];
      const token = /\b(sk_[\w-]+)/.exec(output)?.[1];
      if (url && token) resolve({ url, token });
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    void closed.then((exit) =>
      reject(new Error(`sluice ended before serving (${JSON.stringify(exit)}):\n${output}`)),
    );
  });
  ready.catch(() => undefined); // a CLI that is expected to fail is never awaited ready
  return { child, ready, closed, output: () => output };
}

/** Runs a command to completion; its output goes into the error when it fails. */
async function run(command: string, args: string[], cwd: string): Promise<string> {
  const child = spawn(command, args, { cwd, env: userEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const [code] = (await once(child, 'close')) as [number | null];
  if (code !== 0) throw new Error(`${command} ${args.join(' ')} exited with ${code}:\n${output}`);
  return output;
}

/** Live processes by parent, from /proc (zombies count as gone: they run nothing). */
function processTree(): Map<number, number[]> {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // ended while listing
    }
    // pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
    const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (state === 'Z') continue;
    const list = children.get(Number(ppid)) ?? [];
    list.push(Number(entry));
    children.set(Number(ppid), list);
  }
  return children;
}

function descendantsOf(pid: number): number[] {
  const tree = processTree();
  const found: number[] = [];
  const next = [pid];
  while (next.length > 0) {
    for (const child of tree.get(next.pop()!) ?? []) {
      found.push(child);
      next.push(child);
    }
  }
  return found;
}

function isRunning(pid: number): boolean {
  try {
    return !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
  } catch {
    return false;
  }
}

function isNode(pid: number): boolean {
  try {
    return readlinkSync(`/proc/${pid}/exe`) === realpathSync(process.execPath);
  } catch {
    return false;
  }
}

function commandOf(pid: number): string {
  return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
}

/** The error code of a TCP connection attempt to the server's port. */
async function connectError(url: string): Promise<string | undefined> {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  try {
    await once(socket, 'connect');
    return undefined;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code;
  } finally {
    socket.destroy();
  }
}

describe('bin/sluice.js in the repository', () => {
  test('serves in its own process: a SIGTERM to its PID drains the server and closes the port', async () => {
    const cwd = mkdtempSync(join(scratch, 'bin-'));
    const cli = startCli(process.execPath, [bin, 'serve', '--port', '0'], cwd);
    const { url } = await cli.ready;
    expect(await connectError(url)).toBeUndefined();
    // The server is this PID: no node child that a signal to the wrapper would miss. (tsx may
    // have started esbuild's service, which ends when its parent's pipe closes.)
    const tree = descendantsOf(cli.child.pid!);
    expect(tree.filter(isNode).map(commandOf)).toEqual([]);

    cli.child.kill('SIGTERM');
    // Exit code 0 (not death by the signal): the CLI's own handler ran its drain.
    expect(await cli.closed).toEqual({ code: 0, signal: null });
    expect(tree.filter(isRunning)).toEqual([]);
    expect(await connectError(url)).toBe('ECONNREFUSED');
  }, 180_000);
});

describe('the five packages, packed and installed into an empty folder', () => {
  const app = join(scratch, 'app');

  beforeAll(async () => {
    // Incremental: nothing to do when the build is current, and never a stale dist/ packed.
    await run('npm', ['run', 'build'], root);
    const tarballs = join(scratch, 'tarballs');
    mkdirSync(tarballs);
    await run('npm', ['pack', '--workspaces', '--ignore-scripts', '--pack-destination', tarballs], root);
    const files = readdirSync(tarballs).map((name) => join(tarballs, name));
    expect(files.map((f) => f.slice(tarballs.length + 1)).sort()).toEqual([
      'sluice-0.1.0.tgz',
      'sluice-client-0.1.0.tgz',
      'sluice-postgres-0.1.0.tgz',
      'sluice-server-0.1.0.tgz',
      'sluice-testkit-0.1.0.tgz',
    ]);
    for (const file of files) {
      const tarball = readFileSync(file);
      const { messages, pkg } = await publint({
        pack: { tarball: tarball.buffer.slice(tarball.byteOffset, tarball.byteOffset + tarball.byteLength) },
        strict: true,
      });
      expect(messages.map((m) => `${file}: ${formatMessage(m, pkg)}`)).toEqual([]);
    }
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ private: true }));
    await run('npm', ['install', ...files, '--prefer-offline', '--no-audit', '--no-fund'], app);
  }, 400_000);

  test('npx sluice serve runs the demo on PGlite and the stand-in; a SIGTERM to npx stops the server', async () => {
    const cli = startCli('npx', ['--no', 'sluice', 'serve', '--port', '0'], app);
    const { url, token } = await cli.ready;
    const response = await fetch(`${url}/api/client/v1/agents/writer/runs`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ input: 'tides' }),
    });
    const run = (await response.json()) as { status: string; output: { text: string } };
    expect(response.status).toBe(200);
    expect(run.status).toBe('succeeded');
    expect(run.output.text).toContain('tides');

    // npm starts the bin under `sh -c`: npm, the shell and the server's own node process.
    const tree = descendantsOf(cli.child.pid!);
    expect(tree.map(commandOf).filter((c) => c.includes('node_modules/.bin/sluice serve'))).toHaveLength(1);

    // Only npm's PID is signalled, as a process manager would; npm passes nothing on.
    cli.child.kill('SIGTERM');
    await cli.closed;
    expect(tree.filter(isRunning)).toEqual([]);
    expect(await connectError(url)).toBe('ECONNREFUSED');
  }, 180_000);

  test('without @sluice/testkit and OPENAI_API_KEY, the demo says how to get the stand-in', async () => {
    const testkit = join(app, 'node_modules/@sluice/testkit');
    const aside = join(scratch, 'testkit-aside');
    renameSync(testkit, aside);
    try {
      const cli = startCli('npx', ['--no', 'sluice', 'serve', '--port', '0'], app);
      expect(await cli.closed).toEqual({ code: 1, signal: null });
      expect(cli.output()).toContain('npm install @sluice/testkit');
      expect(cli.output()).toContain('OPENAI_API_KEY');
    } finally {
      renameSync(aside, testkit);
    }
  }, 180_000);
});
