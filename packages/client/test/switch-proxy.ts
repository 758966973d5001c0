import net from 'node:net';
import { afterThisTest } from '../../server/test/helpers.js';

/**
 * A load balancer in miniature on 127.0.0.1: new connections go to `target`; `switchTo` cuts
 * every open connection (a dropped stream) and sends the next ones to another server.
 */
export async function startSwitchProxy(first: string) {
  let target = new URL(first);
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    sockets.add(client).add(upstream);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  afterThisTest(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  );
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    switchTo(next: string) {
      target = new URL(next);
      for (const s of sockets) s.destroy();
    },
  };
}
