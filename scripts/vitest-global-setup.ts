import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { buildPackages } from './build-packages.js';
import { serverOf, type PostgresServer } from './postgres-config.js';
import { installedPgBouncer, startPgBouncer, type RunningPgBouncer } from './pgbouncer.js';
import { freePort, postgresAnswers } from './probes.mjs';
import { serviceDecision, type TestService } from './test-services.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from './postgres.mjs';

export interface PostgresTestConfig {
  host?: string;
  port?: number;
  user?: string;
  password?: string;
  database: string;
}

declare module 'vitest' {
  export interface ProvidedContext {
    /** Connection settings of a fresh database for this test run; `undefined` when PostgreSQL is unavailable. */
    postgres: PostgresTestConfig | undefined;
    /**
     * The same database behind a PgBouncer in transaction mode; `undefined` when pgbouncer is
     * not installed (under CI=true that fails the run instead).
     */
    pgbouncer: PostgresTestConfig | undefined;
    /**
     * A PGlite database folder created and migrated once for the whole run: server tests copy
     * it instead of paying PGlite's initdb (seconds) in every test file.
     */
    pgliteTemplate: string;
    /**
     * A Redis for this run (REDIS_URL when it answers, else a redis-server started here);
     * `undefined` when none is installed (under CI=true the suites that need it then fail).
     */
    redis: string | undefined;
    /** Debian's Chromium for the dashboard suite; `undefined` when it is not installed. */
    chromium: string | undefined;
  }
}

/** Debian's package; CI installs it. Nothing is downloaded at test time. */
const CHROMIUM = '/usr/bin/chromium';

/**
 * A service this run could not find or start: under CI the run fails here, before any test;
 * elsewhere one line says which suites are skipped (each of them says so again).
 */
function missing(service: TestService): void {
  const decision = serviceDecision(`the ${service} suites`, { [service]: false }, process.env);
  if (decision.kind === 'fail') throw new Error(decision.message);
  if (decision.kind === 'skip') console.warn(`\n${decision.line}\n`);
}

/**
 * Finds or starts PostgreSQL, creates a database for this run, puts a PgBouncer in front of
 * it, and drops it all at the end; also finds or starts Redis and finds Chromium. Under CI a
 * missing PostgreSQL, PgBouncer, Redis or Chromium fails the run instead of skipping the suites
 * that need them (scripts/test-services.ts).
 */
export default async function setup(project: TestProject) {
  // The tests run on the sources; the build is for the few that run or pack it. A build that
  // fails here is said once, and those tests fail on it themselves; the rest run.
  try {
    buildPackages();
  } catch (error) {
    console.warn(
      `\nThe packages' build (tsc -b) failed: the tests that need dist/ will fail. ${String(error)}\n`,
    );
  }
  const template = await pgliteTemplate();
  project.provide('pgliteTemplate', template.path);
  const redis = await ensureRedis();
  if (!redis) missing('Redis');
  project.provide('redis', redis?.url);
  const chromium = existsSync(CHROMIUM) ? CHROMIUM : undefined;
  if (!chromium) missing('Chromium');
  project.provide('chromium', chromium);
  const removeTemplate = template.remove;
  template.remove = () => {
    removeTemplate();
    redis?.stop();
  };
  const url = (await ensurePostgres()) as string | undefined;
  if (!url) {
    missing('PostgreSQL');
    project.provide('postgres', undefined);
    project.provide('pgbouncer', undefined);
    return template.remove;
  }
  const { server: config, database: adminDatabase } = serverOf(url);
  const database = `sluice_test_${Date.now().toString(36)}_${process.pid}`;
  const admin = new pg.Client({ ...config, database: adminDatabase });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${database}`);
  await admin.end();
  project.provide('postgres', { ...config, database });

  const bouncer = await ensurePgBouncer(config, database);
  project.provide('pgbouncer', bouncer?.config);
  return async () => {
    template.remove();
    await bouncer?.stop();
    const client = new pg.Client({ ...config, database: adminDatabase });
    await client.connect();
    await client.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    await client.end();
  };
}

/**
 * The embedded store's database, created and migrated in a temporary folder by a child process
 * that reads the packages' TypeScript sources.
 */
async function pgliteTemplate(): Promise<{ path: string; remove: () => void }> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-template-'));
  const made = spawnSync(
    process.execPath,
    [
      '--conditions=@sluice/source',
      '--import',
      'tsx',
      resolve('scripts/pglite-template.ts'),
      join(dir, 'db'),
    ],
    { stdio: ['ignore', 'inherit', 'inherit'] },
  );
  if (made.status !== 0)
    throw new Error(`Creating the PGlite template failed (exit ${made.status ?? made.signal})`);
  return { path: join(dir, 'db'), remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * A PgBouncer in transaction mode in front of `server`: the one named by PGBOUNCER_URL when
 * set (it must answer), else one started here (pgbouncer.ts) on a free loopback port, from an
 * ini written to .sluice/pgbouncer/, and stopped when the run ends.
 */
async function ensurePgBouncer(
  server: PostgresServer,
  database: string,
): Promise<RunningPgBouncer | undefined> {
  if (process.env.PGBOUNCER_URL) {
    const { server: bouncer } = serverOf(process.env.PGBOUNCER_URL);
    const config = { ...bouncer, database };
    if (!(await answers(config))) throw new Error('PGBOUNCER_URL is set but PgBouncer does not answer');
    return { config, stop: async () => undefined };
  }
  const binary = installedPgBouncer() ?? onPath('pgbouncer');
  if (!binary) {
    missing('PgBouncer');
    return undefined;
  }
  return startPgBouncer(binary, server, database, resolve('.sluice/pgbouncer'));
}

const answers = (config: PostgresTestConfig) => postgresAnswers(config);

/**
 * The Redis of this run: REDIS_URL when it answers PING, else Debian's redis-server started on
 * a free loopback port with no persistence, in a folder of its own, and stopped at the end.
 */
async function ensureRedis(): Promise<{ url: string; stop(): void } | undefined> {
  if (process.env.REDIS_URL && (await redisAnswers(process.env.REDIS_URL)))
    return { url: process.env.REDIS_URL, stop: () => undefined };
  const binary = ['/usr/bin/redis-server'].find((p) => existsSync(p)) ?? onPath('redis-server');
  if (!binary) return undefined;
  const dir = mkdtempSync(join(tmpdir(), 'sluice-redis-'));
  const port = await freePort();
  const log = openSync(join(dir, 'redis.log'), 'a');
  const child = spawn(
    binary,
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    { stdio: ['ignore', log, log] },
  );
  const url = `redis://127.0.0.1:${port}`;
  const stop = () => {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  for (let i = 0; i < 100 && child.exitCode === null; i++) {
    if (await redisAnswers(url)) return { url, stop };
    await new Promise((r) => setTimeout(r, 50));
  }
  stop();
  throw new Error(`redis-server did not start on 127.0.0.1:${port}`);
}

/** Whether a Redis answers PING at `url` (host and port only: the test Redis has no password). */
function redisAnswers(url: string): Promise<boolean> {
  const { hostname, port } = new URL(url);
  return new Promise((done) => {
    const socket = connect({ host: hostname, port: Number(port || 6379) });
    const finish = (ok: boolean) => (socket.destroy(), done(ok));
    socket.setTimeout(2000, () => finish(false));
    socket.once('error', () => finish(false));
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.once('data', (chunk) => finish(chunk.toString().startsWith('+PONG')));
  });
}

function onPath(name: string): string | undefined {
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return found.status === 0 ? found.stdout.trim() : undefined;
}
