import type net from 'node:net';
import { createTcpProxy, type TcpProxy } from '../../../../scripts/tcp-proxy.js';
import { join } from 'node:path';
import { postgres } from './database.js';
import { afterThisTest } from './registry.js';

export type { TcpProxy } from '../../../../scripts/tcp-proxy.js';

/**
 * A TCP proxy on 127.0.0.1 in front of this run's PostgreSQL: `cut()` ends every connection
 * through it and refuses new ones (what a database restart looks like from the server),
 * `restore()` lets connections through again, `stall()` stops forwarding on the open ones.
 */
export async function startDatabaseProxy(): Promise<TcpProxy> {
  if (!postgres) throw new Error('PostgreSQL is not available');
  return startTcpProxy(
    postgres.host?.startsWith('/')
      ? { path: join(postgres.host, `.s.PGSQL.${postgres.port ?? 5432}`) }
      : { host: postgres.host ?? '127.0.0.1', port: postgres.port ?? 5432 },
  );
}

/** The same proxy in front of any `target` (a Redis, say), closed after the test. */
export async function startTcpProxy(target: net.NetConnectOpts): Promise<TcpProxy> {
  const proxy = await createTcpProxy(target);
  afterThisTest(
    () => proxy.close(),
    `the TCP proxy on port ${proxy.port}`,
    () =>
      proxy.listening
        ? ['still listening']
        : proxy.openSockets > 0
          ? [`${proxy.openSockets} socket(s) open`]
          : [],
  );
  return proxy;
}

/** The database name of a `postgresql://` connection string. */
export function databaseNameOf(databaseUrl: string): string {
  return new URL(databaseUrl.replace(/^postgresql:\/\/[^/]*\//, 'http://x/')).pathname.slice(1);
}

/** The connection string of `databaseUrl`'s database, through a proxy on `port`. */
export function throughProxy(databaseUrl: string, port: number): string {
  const database = databaseNameOf(databaseUrl);
  return `postgresql://${encodeURIComponent(postgres?.user ?? 'root')}@127.0.0.1:${port}/${database}`;
}

/** The connection string of `databaseUrl`'s database, through a PgBouncer (host, port, user). */
export function throughPgBouncer(
  bouncer: { host?: string; port?: number; user?: string },
  databaseUrl: string,
): string {
  return `postgresql://${encodeURIComponent(bouncer.user!)}@${bouncer.host}:${bouncer.port}/${databaseNameOf(databaseUrl)}`;
}
