import http from 'node:http';
import type net from 'node:net';
import { afterThisTest } from '../../server/test/helpers.js';

/** A request as a raw server saw it. */
export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  /** performance.now() when it came. */
  at: number;
  /** Resolves when the request's connection closes. */
  closed: Promise<void>;
}

/**
 * A bare node:http server on 127.0.0.1 playing a broken or hostile run server: `answer` gets
 * each request with its number (from 0) and writes whatever it likes, or destroys the socket.
 * Closed, connections and all, after the test.
 */
export async function startRawServer(
  answer: (req: http.IncomingMessage, res: http.ServerResponse, n: number) => void | Promise<void>,
) {
  const seen: Seen[] = [];
  const sockets = new Set<net.Socket>();
  const server = http.createServer((req, res) => {
    const n =
      seen.push({
        method: req.method!,
        url: req.url!,
        headers: req.headers,
        at: performance.now(),
        closed: new Promise<void>((resolve) => req.socket.once('close', () => resolve())),
      }) - 1;
    void Promise.resolve(answer(req, res, n)).catch((error: unknown) => {
      res.destroy(error as Error);
    });
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  afterThisTest(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
    'a raw server',
  );
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    seen,
  };
}

/** One SSE frame as the run server writes it. */
export const frame = (id: number, event: string, data: unknown) =>
  `id: ${id}\nevent: ${event}\ndata: ${JSON.stringify(data)}\n\n`;

export const RUN_ID = 'run_0123456789abcdefghijklmn';
/** A run document, as `run.created` and the final events carry it. */
export const run = (status: string) => ({
  id: RUN_ID,
  object: 'agent.run',
  agent: 'a',
  class: 'default',
  status,
  error: null,
  metadata: {},
  usage: null,
  created_at: 1,
  started_at: null,
  finished_at: null,
  scheduled_for: null,
  thread_id: null,
});

export const delta = (text: string) => ({ run_id: RUN_ID, text });

/** Starts an SSE answer. */
export function sse(res: http.ServerResponse, contentType = 'text/event-stream; charset=utf-8') {
  res.writeHead(200, { 'content-type': contentType, 'cache-control': 'no-cache' });
  res.flushHeaders();
}

/** Answers JSON with `status` and extra headers. */
export function json(res: http.ServerResponse, status: number, body: unknown, headers = {}) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(text);
}

/** Writes `text` and resolves once it is handed to the socket. */
export const write = (res: http.ServerResponse, text: string) =>
  new Promise<void>((resolve, reject) => res.write(text, (error) => (error ? reject(error) : resolve())));

/** Writes `text`, then cuts the connection (no end of the chunked body): a dropped stream. */
export async function cut(res: http.ServerResponse, text = '') {
  if (text) await write(res, text);
  res.socket?.destroy();
}
