import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createToken } from '@sluice/server';
import { toDatabase, type Database } from '@sluice/postgres/database';
import { migrate } from '../../src/store/store.js';
import {
  afterThisTest,
  deferred,
  freshDatabase,
  replyOf,
  testPool,
  type Body,
  type Reply,
} from '../helpers.js';

/**
 * Real server processes for the tests of this folder: the repository's `sluice` wrapper (or the
 * test worker), each killed after its test whatever happened, so that none outlives it and
 * claims another test's runs.
 */

export const root = fileURLToPath(new URL('../../../../', import.meta.url));
export const bin = join(root, 'packages/server/bin/sluice.js');
export const echoConfig = fileURLToPath(new URL('./fixtures/echo.config.ts', import.meta.url));
export const slowConfig = fileURLToPath(new URL('./fixtures/slow.config.ts', import.meta.url));
const worker = fileURLToPath(new URL('../workers/server-process.ts', import.meta.url));
const openStoreScript = fileURLToPath(new URL('./fixtures/open-store.ts', import.meta.url));

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface Proc {
  readonly child: ChildProcess;
  readonly pid: number;
  /** stdout and stderr so far, interleaved as they came. */
  output(): string;
  /** Resolves with the first match of `pattern` in the output; rejects if the process ends first. */
  waitFor(pattern: RegExp): Promise<RegExpExecArray>;
  /** The exit, once every pipe of the process is closed (so `output()` is complete). */
  readonly closed: Promise<Exit>;
}

/**
 * The environment of a process manager: none of npm's or vitest's variables (npm's would make
 * the wrapper watch for an npm parent), no database or provider key unless given, quiet logs.
 */
export function processEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of Object.keys(env)) {
    if (key.startsWith('npm_') || key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
  }
  delete env.DATABASE_URL;
  delete env.OPENAI_API_KEY;
  return { ...env, SLUICE_LOG_LEVEL: 'silent', ...extra };
}

/** Starts a process; SIGKILLed after the test if it is still there (a stopped one included). */
export function spawnProcess(
  command: string,
  args: string[],
  options: { cwd: string; env: NodeJS.ProcessEnv; stdin?: 'ignore' | 'pipe' },
): Proc {
  const child = spawn(command, args, {
    cwd: options.cwd,
    env: options.env,
    stdio: [options.stdin ?? 'ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const listeners = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    output += chunk.toString();
    for (const listener of [...listeners]) listener();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const closed = once(child, 'close').then(([code, signal]) => ({
    code: code as number | null,
    signal: signal as NodeJS.Signals | null,
  }));
  afterThisTest(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
  });
  return {
    child,
    pid: child.pid!,
    output: () => output,
    closed,
    waitFor: (pattern) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const match = pattern.exec(output);
          if (!match) return;
          listeners.delete(check);
          resolve(match);
        };
        listeners.add(check);
        check();
        void closed.then((exit) => {
          if (!listeners.has(check)) return;
          listeners.delete(check);
          reject(new Error(`process ended (${JSON.stringify(exit)}) before printing ${pattern}:\n${output}`));
        });
      }),
  };
}

/** A temporary folder, removed after the test. */
export function tempDir(prefix = 'sluice-proc-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  afterThisTest(async () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** `node packages/server/bin/sluice.js ...args` in `cwd`, as an operator runs it from a checkout. */
export function sluice(args: string[], options: { cwd?: string; env?: Record<string, string> } = {}): Proc {
  return spawnProcess(process.execPath, [bin, ...args], {
    cwd: options.cwd ?? tempDir(),
    env: processEnv(options.env),
  });
}

/** The URL `sluice serve` prints once it accepts runs. */
export const servingLine = /Sluice is serving .* on (http:\/\/127\.0\.0\.1:\d+)/;

export interface ServerProc extends Proc {
  readonly url: string;
}

/** `sluice serve --port 0` with the echo config; resolves once it serves. */
export async function startServer(
  env: Record<string, string>,
  options: { cwd?: string; args?: string[] } = {},
): Promise<ServerProc> {
  const proc = sluice(['serve', '--port', '0', '--config', echoConfig, ...(options.args ?? [])], {
    cwd: options.cwd,
    env,
  });
  const [, url] = await proc.waitFor(servingLine);
  return { ...proc, url: url! };
}

/** The test worker (test/workers/server-process.ts), whose SIGTERM handler calls `close()`. */
export async function startWorker(env: Record<string, string>): Promise<ServerProc> {
  const proc = spawnProcess(process.execPath, ['--conditions=@sluice/source', '--import', 'tsx', worker], {
    cwd: root,
    env: processEnv(env),
  });
  const [, url] = await proc.waitFor(/^listening (http\S+)$/m);
  return { ...proc, url: url! };
}

/** A process that opens the embedded store at `dataDir` once a line is written to its stdin. */
export async function storeOpener(dataDir: string): Promise<Proc> {
  const proc = spawnProcess(
    process.execPath,
    ['--conditions=@sluice/source', '--import', 'tsx', openStoreScript, dataDir],
    {
      cwd: root,
      env: processEnv(),
      stdin: 'pipe',
    },
  );
  await proc.waitFor(/ready/);
  return proc;
}

export interface TestDatabase {
  readonly url: string;
  readonly db: Database;
  /** A token's secret (and id) for tenant `t`, project `p`. */
  token(
    who?: Partial<{ tenant: string; project: string; user: string; role: 'admin' | 'member' | 'read' }>,
  ): Promise<{
    id: string;
    secret: string;
  }>;
  /** The rows of a query. */
  rows<T = Body>(sql: string, params?: unknown[]): Promise<T[]>;
}

/** A new PostgreSQL database for this test, migrated, with a small pool of its own. */
export async function testDatabase(): Promise<TestDatabase> {
  const url = await freshDatabase();
  const pool = testPool(url);
  const db = toDatabase(pool);
  await migrate(db);
  return {
    url,
    db,
    token: (who = {}) =>
      createToken(db, {
        tenant: who.tenant ?? 't',
        project: who.project ?? 'p',
        user: who.user ?? 'u',
        role: who.role ?? 'admin',
      }),
    rows: async (sql, params = []) => (await pool.query(sql, params)).rows,
  };
}

/**
 * One HTTP request, sent with the path exactly as written (`fetch` would be free to normalise
 * it): the tests try spellings such as `/%61pi/...`. Answered in the harness client's `Reply`
 * shape; a body that is not JSON comes as `{ text }`.
 */
export function send(
  base: string,
  method: string,
  path: string,
  options: { token?: string; body?: unknown } = {},
): Promise<Reply> {
  const { hostname, port } = new URL(base);
  const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
  const answer = new Promise<Reply>((resolve, reject) => {
    const req = request(
      {
        host: hostname,
        port: Number(port),
        method,
        path,
        headers: {
          ...(options.token ? { authorization: `Bearer ${options.token}` } : {}),
          ...(payload
            ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) }
            : {}),
        },
      },
      (res) => {
        let text = '';
        res.on('data', (chunk: Buffer) => (text += chunk.toString()));
        res.on('end', () => {
          let body: Body;
          try {
            body = JSON.parse(text) as Body;
          } catch {
            body = { text };
          }
          resolve(replyOf(res.statusCode!, res.headers, body));
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
  // A held request still open when a failing test kills its server rejects; the test that
  // awaits it sees that, and one that failed before awaiting it is not reported twice.
  answer.catch(() => undefined);
  return answer;
}

/** A promise and the function that resolves it (the harness's `deferred`, opened by `open`). */
export function gate(): { promise: Promise<void>; open(): void } {
  const { promise, resolve } = deferred();
  return { promise, open: () => resolve() };
}
