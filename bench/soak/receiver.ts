/**
 * What the servers tell the soak: each execution of the `mark` tool (run, process) and each
 * callback delivery (its `webhook-id`, the run it is for). Always answers 200.
 */
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Execution {
  runId: string;
  token: string;
  pid: number;
  /** When the tool began, on the server's clock (the same machine's). */
  startedAt: number;
  /** When the receiver read it. */
  at: number;
}

export interface Delivery {
  deliveryId: string;
  runId: string;
  status: string;
  at: number;
}

export interface Receiver {
  readonly url: string;
  readonly executions: readonly Execution[];
  readonly deliveries: readonly Delivery[];
  close(): Promise<void>;
}

const bodyOf = async (request: IncomingMessage): Promise<string> => {
  let text = '';
  for await (const chunk of request) text += String(chunk);
  return text;
};

export async function startReceiver(): Promise<Receiver> {
  const executions: Execution[] = [];
  const deliveries: Delivery[] = [];
  const server = createServer((request, response) => {
    void bodyOf(request)
      .then((text) => {
        const body = JSON.parse(text) as Record<string, unknown>;
        if (request.url === '/executed') {
          executions.push({
            runId: String(body.runId),
            token: String(body.token),
            pid: Number(body.pid),
            startedAt: Number(body.startedAt),
            at: Date.now(),
          });
        } else if (request.url === '/callback') {
          deliveries.push({
            deliveryId: String(request.headers['webhook-id']),
            runId: String(body.id),
            status: String(body.status),
            at: Date.now(),
          });
        }
        response.writeHead(200).end('ok');
      })
      .catch(() => response.writeHead(400).end('bad body'));
  });
  server.keepAliveTimeout = 1000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    executions,
    deliveries,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
