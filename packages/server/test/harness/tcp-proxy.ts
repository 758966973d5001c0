import net from 'node:net';
import { join } from 'node:path';
import { postgres } from './database.js';
import { afterThisTest } from './registry.js';

/** A TCP proxy on 127.0.0.1 (see `startDatabaseProxy`). */
export interface TcpProxy {
  port: number;
  /** Connections refused (closed at once) while cut. */
  readonly refused: number;
  cut(): void;
  restore(): void;
  stall(): void;
  close(): Promise<void>;
}

/**
 * A TCP proxy on 127.0.0.1 in front of this run's PostgreSQL: `cut()` ends every connection
 * through it and refuses new ones (what a database restart looks like from the server),
 * `restore()` lets connections through again. `stall()` stops forwarding on the connections
 * open now without closing them (a NAT that forgot them, a partition with no reset); new
 * connections still go through.
 */
export async function startDatabaseProxy(): Promise<TcpProxy> {
  if (!postgres) throw new Error('PostgreSQL is not available');
  return startTcpProxy(
    postgres.host?.startsWith('/')
      ? { path: join(postgres.host, `.s.PGSQL.${postgres.port ?? 5432}`) }
      : { host: postgres.host ?? '127.0.0.1', port: postgres.port ?? 5432 },
  );
}

/** The same proxy in front of any `target` (a Redis, say). */
export async function startTcpProxy(target: net.NetConnectOpts): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>();
  const pairs = new Set<[net.Socket, net.Socket]>();
  let down = false;
  let refused = 0;
  const server = net.createServer((client) => {
    if (down) {
      refused++;
      return client.destroy();
    }
    const upstream = net.connect(target);
    sockets.add(client).add(upstream);
    const pair: [net.Socket, net.Socket] = [client, upstream];
    pairs.add(pair);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
      pairs.delete(pair);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  const proxy = {
    port,
    get refused() {
      return refused;
    },
    cut() {
      down = true;
      for (const s of sockets) s.destroy();
      sockets.clear();
    },
    restore() {
      down = false;
    },
    stall() {
      // What either side sends from now on goes nowhere, and nothing closes.
      for (const [client, upstream] of pairs) {
        client.unpipe(upstream);
        upstream.unpipe(client);
        client.on('data', () => undefined);
        upstream.on('data', () => undefined);
      }
    },
    close: () =>
      new Promise<void>((resolve) => {
        proxy.cut();
        server.close(() => resolve());
      }),
  };
  afterThisTest(
    () => proxy.close(),
    `the TCP proxy on port ${port}`,
    () =>
      server.listening ? ['still listening'] : sockets.size > 0 ? [`${sockets.size} socket(s) open`] : [],
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
