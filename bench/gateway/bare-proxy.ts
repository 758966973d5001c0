/**
 * The floor under any gateway, for bench:gateway: a proxy of a few lines in a process of its
 * own, between the same client and the same stand-in. A node:http server and an undici pool,
 * as the gateway has, and nothing else: no authentication, no slot, no usage read, no metrics,
 * no routing, and only the hop-by-hop headers dropped. What it adds over calling the stand-in
 * directly is what one more process and two more loopback hops cost on this machine; what the
 * gateway adds over it is the gateway's own work.
 */
import { createServer } from 'node:http';
import { setFlagsFromString } from 'node:v8';
import type { AddressInfo } from 'node:net';
import { Pool, type Dispatcher } from 'undici';
import { answerBench } from './child.js';

// The gateway's process runs with V8's allocation-site pretenuring off, as `sluice serve` sets
// it (packages/server/src/heap-tuning.ts): this one too, so that what the gateway adds over it
// is the gateway's work and not a GC setting. A flag on the command line wins, as it does there.
if (!process.execArgv.some((arg) => arg.replaceAll('_', '-').includes('allocation-site-pretenuring')))
  setFlagsFromString('--no-allocation-site-pretenuring');

const upstream = new URL(process.env.UPSTREAM!);
const pool = new Pool(upstream.origin, { headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 60_000 });
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'host', 'content-length']);

const server = createServer((request, response) => {
  const chunks: Buffer[] = [];
  request.on('data', (chunk: Buffer) => chunks.push(chunk));
  request.on('end', () => {
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(request.headers))
      if (typeof value === 'string' && !HOP_BY_HOP.has(name)) headers[name] = value;
    const handler: Dispatcher.DispatchHandler = {
      // undici takes a handler with this method as one of its new shape (the gateway's is too).
      onRequestStart() {},
      onResponseStart(_controller, status, raw) {
        const out: Record<string, string | string[]> = {};
        for (const [name, value] of Object.entries(raw))
          if (value !== undefined && !HOP_BY_HOP.has(name)) out[name] = value;
        response.writeHead(status, out);
      },
      onResponseData(controller, chunk) {
        if (!response.write(chunk)) {
          controller.pause();
          response.once('drain', () => controller.resume());
        }
      },
      onResponseEnd() {
        response.end();
      },
      onResponseError() {
        response.destroy();
      },
    };
    pool.dispatch(
      {
        method: (request.method ?? 'GET') as Dispatcher.HttpMethod,
        path: request.url ?? '/',
        headers,
        body: Buffer.concat(chunks),
      },
      handler,
    );
  });
});
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as AddressInfo;
  answerBench({ url: `http://127.0.0.1:${port}${upstream.pathname.replace(/\/$/, '')}` }, async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await pool.close();
  });
});
