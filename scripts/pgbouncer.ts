/**
 * Starts a PgBouncer in transaction mode in front of a PostgreSQL server, on a free loopback
 * port: the test run's own (vitest-global-setup.ts), and any a test needs with other settings.
 *
 * Clients log in without a password (`auth_type = any`, on 127.0.0.1 only) and PgBouncer logs
 * in to PostgreSQL as one fixed role. pgbouncer refuses to run as root, so under root it drops
 * to the `postgres` user, and then uses the `postgres` role over the socket, which peer
 * authentication accepts.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, openSync, writeFileSync } from 'node:fs';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import type { PostgresServer } from './postgres-config.js';
import { freePort, postgresAnswers } from './probes.mjs';

export interface RunningPgBouncer {
  config: PostgresServer & { database: string };
  stop(): Promise<void>;
}

/** The pgbouncer binary where Debian puts it, if installed there. */
export const installedPgBouncer = (): string | undefined =>
  ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer'].find((p) => existsSync(p));

/**
 * The ini of a PgBouncer in transaction mode on 127.0.0.1:`port` in front of `target` (a libpq
 * connection string), clients let in without a password; `settings` are more lines of its
 * `[pgbouncer]` section. pgbouncer refuses to run as root: started as root, it drops to the
 * `postgres` user.
 */
export function pgbouncerIni(
  target: string,
  port: number,
  settings: string[],
  ignoreStartupParameters: string[] = [],
): string {
  return [
    '[databases]',
    `* = ${target}`,
    '',
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${port}`,
    'unix_socket_dir =',
    'auth_type = any',
    'pool_mode = transaction',
    `ignore_startup_parameters = ${['extra_float_digits', 'options', ...ignoreStartupParameters].join(',')}`,
    ...settings,
    ...(process.getuid?.() === 0 ? ['user = postgres'] : []),
    '',
  ].join('\n');
}

/**
 * A PgBouncer started from an ini written to `dir` (its log beside it); it answers before this
 * resolves. `ignoreStartupParameters`: settings a client sends at connect that it accepts and
 * drops, besides the two node-postgres may send.
 */
export async function startPgBouncer(
  binary: string,
  server: PostgresServer,
  database: string,
  dir: string,
  ignoreStartupParameters: string[] = [],
): Promise<RunningPgBouncer> {
  const root = process.getuid?.() === 0;
  const host = server.host ?? '127.0.0.1';
  const socket = host.startsWith('/');
  const login =
    root && socket
      ? { user: 'postgres' }
      : { user: server.user ?? userInfo().username, password: server.password };
  const target = [
    `host=${host}`,
    `port=${server.port ?? 5432}`,
    `user=${login.user}`,
    ...(login.password ? [`password=${login.password}`] : []),
  ].join(' ');
  const port = await freePort();
  mkdirSync(dir, { recursive: true });
  const ini = join(dir, 'pgbouncer.ini');
  writeFileSync(
    ini,
    pgbouncerIni(target, port, ['max_client_conn = 1000', 'default_pool_size = 40'], ignoreStartupParameters),
  );
  const log = openSync(join(dir, 'pgbouncer.log'), 'a');
  const child = spawn(binary, [ini], { stdio: ['ignore', log, log] });
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const config = { host: '127.0.0.1', port, user: userInfo().username, database };
  for (let i = 0; i < 100 && child.exitCode === null; i++) {
    if (await postgresAnswers(config)) return { config, stop: () => (child.kill('SIGTERM'), exited) };
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill('SIGKILL');
  throw new Error(`PgBouncer did not start on 127.0.0.1:${port}; see ${join(dir, 'pgbouncer.log')}`);
}
