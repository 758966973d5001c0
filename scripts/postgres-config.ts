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
