import net from 'node:net';

/** A TCP proxy on 127.0.0.1 in front of one target, for injecting network faults. */
export interface TcpProxy {
  readonly port: number;
  /** Connections refused (closed at once) while cut. */
  readonly refused: number;
  /** Sockets open now, both sides of each connection counted. */
  readonly openSockets: number;
  readonly listening: boolean;
  /** Ends every connection through the proxy and refuses new ones (a restart, seen from the client). */
  cut(): void;
  restore(): void;
  /**
   * Stops forwarding on the connections open now without closing them (a NAT that forgot them,
   * a partition with no reset); new connections still go through.
   */
  stall(): void;
  close(): Promise<void>;
}

/** Starts a proxy on a free loopback port that forwards each connection to `target`. */
export async function createTcpProxy(target: net.NetConnectOpts): Promise<TcpProxy> {
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
  const proxy: TcpProxy = {
    port,
    get refused() {
      return refused;
    },
    get openSockets() {
      return sockets.size;
    },
    get listening() {
      return server.listening;
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
      pairs.clear();
    },
    close: () =>
      new Promise<void>((resolve) => {
        proxy.cut();
        server.close(() => resolve());
      }),
  };
  return proxy;
}
