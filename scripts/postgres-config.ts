import { parse } from 'pg-connection-string';

/** Where a PostgreSQL server is, without a database: what tests and benchmarks connect with. */
export interface PostgresServer {
  host?: string;
  port?: number;
  user?: string;
  password?: string;
}

/** Splits a connection string into the server and its database. */
export function serverOf(url: string): { server: PostgresServer; database: string } {
  const base = parse(url);
  return {
    server: {
      host: base.host ?? undefined,
      port: base.port ? Number(base.port) : undefined,
      user: base.user ?? undefined,
      password: base.password || undefined,
    },
    database: base.database ?? 'postgres',
  };
}

/** A connection string for `database` on `server` (socket hosts go in the query string). */
export function urlOf(server: PostgresServer, database: string): string {
  const user = server.password
    ? `${encodeURIComponent(server.user ?? '')}:${encodeURIComponent(server.password)}`
    : encodeURIComponent(server.user ?? '');
  const host = server.host
    ? `?host=${encodeURIComponent(server.host)}${server.port ? `&port=${server.port}` : ''}`
    : '';
  return `postgresql://${user}@/${database}${host}`;
}

/** The part of a `pg.Pool` that {@link endPool} uses. */
interface EndablePool {
  readonly totalCount: number;
  end(): Promise<void>;
  on(event: 'remove', listener: () => void): unknown;
}

/**
 * Ends a `pg.Pool` and waits until every connection it had has closed its socket.
 *
 * `pool.end()` resolves as soon as it has asked its idle connections to end, before they
 * have: a `DROP DATABASE ... WITH (FORCE)` sent right after terminates the backends still
 * there, and their clients, still carrying the pool's idle listener, emit `'error'` on the
 * pool. The pool emits `'remove'` once a connection's socket has closed; this counts them.
 * Call it when nothing uses the pool any more (a connection still connecting is counted too).
 */
export async function endPool(pool: EndablePool): Promise<void> {
  let open = pool.totalCount;
  const closed = new Promise<void>((resolve) => {
    if (open === 0) return resolve();
    pool.on('remove', () => {
      if (--open === 0) resolve();
    });
  });
  await pool.end();
  await closed;
}
