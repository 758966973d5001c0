import { PGlite } from '@electric-sql/pglite';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { inject } from 'vitest';

/** Connection settings of this run's PostgreSQL database (see scripts/vitest-global-setup.ts). */
export const postgresConfig = inject('postgres');

/** The same database behind PgBouncer in transaction mode, when pgbouncer is installed. */
export const pgbouncerConfig = inject('pgbouncer');

/** A pool on this run's database. */
export function createPool(max = 10, options: pg.PoolConfig = {}): pg.Pool {
  if (!postgresConfig) throw new Error('PostgreSQL is not available');
  return new pg.Pool({ ...postgresConfig, max, ...options });
}

/** A unique schema name per test file, so files never see each other's tables. */
export function uniqueSchema(prefix: string): string {
  return `${prefix}_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6)}`;
}

export async function createPGlite(): Promise<PGlite> {
  const db = new PGlite();
  await db.waitReady;
  return db;
}

/** Waits until `check` holds: for real I/O to finish, never as a timing assertion. */
export async function until(
  check: () => Promise<boolean> | boolean,
  what: string,
  tries = 400,
): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await check()) return;
    await sleep(25);
  }
  throw new Error(`timed out waiting until ${what}`);
}

/**
 * A TCP proxy on 127.0.0.1 in front of this run's PostgreSQL: `cut()` drops every connection
 * and refuses new ones (the database is gone, as far as a pool on the proxy can tell);
 * `restore()` listens again on the same port.
 */
export interface DatabaseProxy {
  readonly port: number;
  /**
   * The next answer the database sends reaches its client with PostgreSQL's FATAL 57P01
   * (what pg_terminate_backend sends) in the same read, and the connection closes: a backend
   * terminated just as it finished a statement, on a loaded machine.
   */
  terminateAfterNextAnswer(): void;
  cut(): Promise<void>;
  restore(): Promise<void>;
  close(): Promise<void>;
}

export async function startDatabaseProxy(): Promise<DatabaseProxy> {
  if (!postgresConfig) throw new Error('PostgreSQL is not available');
  const { host = '127.0.0.1', port = 5432 } = postgresConfig;
  const target = host.startsWith('/') ? { path: `${host}/.s.PGSQL.${port}` } : { host, port };
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  let terminateNext = false;
  const listen = (at: number) =>
    new Promise<number>((resolve, reject) => {
      const s = createServer((client) => {
        const upstream = createConnection(target);
        for (const socket of [client, upstream]) {
          sockets.add(socket);
          socket.on('error', () => undefined);
          socket.on('close', () => sockets.delete(socket));
        }
        client.pipe(upstream);
        upstream.on('data', (chunk: Buffer) => {
          if (!terminateNext) return void client.write(chunk);
          terminateNext = false;
          client.end(Buffer.concat([chunk, terminationMessage()]));
          upstream.destroy();
        });
        client.on('close', () => upstream.destroy());
        upstream.on('close', () => client.destroy());
      });
      s.once('error', reject);
      s.listen(at, '127.0.0.1', () => {
        server = s;
        const address = s.address();
        resolve(typeof address === 'object' && address ? address.port : at);
      });
    });
  const stop = async () => {
    const s = server;
    server = undefined;
    for (const socket of sockets) socket.destroy();
    if (s) await new Promise<void>((resolve) => s.close(() => resolve()));
  };
  const bound = await listen(0);
  return {
    port: bound,
    terminateAfterNextAnswer: () => void (terminateNext = true),
    cut: stop,
    restore: async () => void (await listen(bound)),
    close: stop,
  };
}

/** PostgreSQL's ErrorResponse for a terminated backend: FATAL, 57P01 (protocol 3.0). */
function terminationMessage(): Buffer {
  const fields = Buffer.from(
    'SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0',
    'utf8',
  );
  const header = Buffer.alloc(5);
  header.write('E', 0);
  header.writeInt32BE(fields.length + 4, 1);
  return Buffer.concat([header, fields]);
}

/** A pool that reaches this run's database through `proxy`; pool errors are expected here. */
export function poolThrough(proxy: DatabaseProxy, max = 4): pg.Pool {
  if (!postgresConfig) throw new Error('PostgreSQL is not available');
  const pool = new pg.Pool({
    user: postgresConfig.user,
    password: postgresConfig.password,
    database: postgresConfig.database,
    host: '127.0.0.1',
    port: proxy.port,
    max,
  });
  pool.on('error', () => undefined);
  return pool;
}
