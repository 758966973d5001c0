/**
 * The soak's own services: a PostgreSQL cluster, a PgBouncer in transaction mode in front of
 * it, and a Redis, each in a temporary folder on a free loopback port, so that the faults the
 * soak injects (a PostgreSQL restart, a Redis restart) reach nobody else on the machine.
 *
 * PostgreSQL and PgBouncer refuse to run as root: under root they run as the `postgres` user
 * (Debian's packages create it), and their folder is given to it.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, postgresAnswers } from '../../scripts/probes.mjs';
import { installedPgBouncer, pgbouncerIni } from '../../scripts/pgbouncer.js';

const asRoot = process.getuid?.() === 0;

export { freePort };

function postgresBin(): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).sort((a, b) => Number(b) - Number(a)) : [];
  const found = versions.map((v) => join(root, v, 'bin')).find((dir) => existsSync(join(dir, 'pg_ctl')));
  if (!found)
    throw new Error(
      'The soak needs PostgreSQL binaries under /usr/lib/postgresql (apt-get install postgresql)',
    );
  return found;
}

/** `command args` as the services' user: `postgres` under root, else this user. */
function runAs(command: string, args: string[]): { ok: boolean; out: string } {
  const [cmd, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', command, ...args]] : [command, args];
  const result = spawnSync(cmd, argv, { encoding: 'utf8' });
  return { ok: result.status === 0, out: `${result.stdout ?? ''}${result.stderr ?? ''}`.trim() };
}

function ownedFolder(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  if (asRoot) {
    const ids = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
    const gids = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
    chownSync(dir, Number(ids.stdout.trim()), Number(gids.stdout.trim()));
  }
  return dir;
}

const answers = (url: string) => postgresAnswers(url, 2000);

async function waitUntil(check: () => Promise<boolean>, what: string, timeoutMs = 30_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${what} did not come up within ${timeoutMs} ms`);
}

export interface Postgres {
  /** A superuser's URL over TCP, straight to the server. */
  readonly url: string;
  readonly port: number;
  /** Stops at once, as a crash would (`-m immediate`), then starts again: crash recovery included. */
  restart(): Promise<void>;
  stop(): void;
}

/** A fresh cluster: initdb (no fsync, trust on loopback), started on a free port. */
export async function startPostgres(): Promise<Postgres> {
  const bin = postgresBin();
  const dir = ownedFolder('sluice-soak-pg-');
  const data = join(dir, 'data');
  const made = runAs(join(bin, 'initdb'), ['-D', data, '-U', 'postgres', '--auth=trust', '--no-sync']);
  if (!made.ok) throw new Error(`initdb failed: ${made.out}`);
  const port = await freePort();
  const options = [
    `-p ${port}`,
    `-k ${dir}`,
    "-c listen_addresses='127.0.0.1'",
    '-c max_connections=400',
    // No fsync: the soak kills PostgreSQL, never the machine, so what reached the OS survives.
    // synchronous_commit stays on: off, a crash may lose commits already acknowledged, which
    // the checker would rightly count as lost runs.
    '-c fsync=off',
  ].join(' ');
  const start = () => {
    const started = runAs(join(bin, 'pg_ctl'), [
      '-D',
      data,
      '-l',
      join(dir, 'server.log'),
      '-w',
      '-o',
      options,
      'start',
    ]);
    if (!started.ok) throw new Error(`pg_ctl start failed: ${started.out}`);
  };
  start();
  const url = `postgresql://postgres@127.0.0.1:${port}/postgres`;
  await waitUntil(() => answers(url), 'PostgreSQL');
  return {
    url,
    port,
    async restart() {
      runAs(join(bin, 'pg_ctl'), ['-D', data, '-m', 'immediate', '-w', 'stop']);
      start();
      await waitUntil(() => answers(url), 'PostgreSQL after its restart');
    },
    stop() {
      runAs(join(bin, 'pg_ctl'), ['-D', data, '-m', 'immediate', '-w', 'stop']);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface Service {
  readonly port: number;
  readonly url: string;
  restart(): Promise<void>;
  stop(): void;
}

function daemon(command: string, args: string[], logFile: string): ChildProcess {
  const log = openSync(logFile, 'a');
  return spawn(command, args, { stdio: ['ignore', log, log] });
}

/** PgBouncer in transaction mode in front of `postgres`, as a platform team runs it. */
export async function startPgBouncer(postgres: Postgres, database: string): Promise<Service> {
  const binary = installedPgBouncer();
  if (!binary) throw new Error('The soak needs pgbouncer (apt-get install pgbouncer)');
  const dir = ownedFolder('sluice-soak-bouncer-');
  const port = await freePort();
  const ini = join(dir, 'pgbouncer.ini');
  writeFileSync(
    ini,
    pgbouncerIni(`host=127.0.0.1 port=${postgres.port} user=postgres`, port, [
      'max_client_conn = 2000',
      'default_pool_size = 60',
      'server_login_retry = 1',
      // The soak samples its clients on the admin console (SHOW POOLS).
      'admin_users = postgres',
    ]),
  );
  let child = daemon(binary, [ini], join(dir, 'pgbouncer.log'));
  const url = `postgresql://postgres@127.0.0.1:${port}/${database}`;
  await waitUntil(() => answers(url), 'PgBouncer');
  const kill = async () => {
    const gone = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await gone;
  };
  return {
    port,
    url,
    async restart() {
      await kill();
      child = daemon(binary, [ini], join(dir, 'pgbouncer.log'));
      await waitUntil(() => answers(url), 'PgBouncer after its restart');
    },
    stop() {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A Redis with no persistence: a restart loses every key, as a cache's restart may. */
export async function startRedis(): Promise<Service> {
  const binary = ['/usr/bin/redis-server', '/usr/local/bin/redis-server'].find((p) => existsSync(p));
  if (!binary) throw new Error('The soak needs redis-server (apt-get install redis-server)');
  const dir = mkdtempSync(join(tmpdir(), 'sluice-soak-redis-'));
  const port = await freePort();
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--save',
    '',
    '--appendonly',
    'no',
    '--dir',
    dir,
  ];
  let child = daemon(binary, args, join(dir, 'redis.log'));
  const url = `redis://127.0.0.1:${port}`;
  await waitUntil(() => redisAnswers(port), 'Redis');
  return {
    port,
    url,
    async restart() {
      const gone = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await gone;
      child = daemon(binary, args, join(dir, 'redis.log'));
      await waitUntil(() => redisAnswers(port), 'Redis after its restart');
    },
    stop() {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function redisAnswers(port: number): Promise<boolean> {
  const { connect } = await import('node:net');
  return new Promise((done) => {
    const socket = connect({ host: '127.0.0.1', port });
    const finish = (ok: boolean) => (socket.destroy(), done(ok));
    socket.setTimeout(1000, () => finish(false));
    socket.once('error', () => finish(false));
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.once('data', (chunk) => finish(chunk.toString().startsWith('+PONG')));
  });
}
