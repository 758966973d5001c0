import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { buildConnector, Pool, type Dispatcher } from 'undici';
import type { ResolvedGateway } from './config.js';

/** One request to a gateway's upstream, as the gateway sends it. */
export interface UpstreamRequest {
  readonly method: string;
  /** The path and query, checked (path.ts) and joined as text, never resolved. */
  readonly path: string;
  readonly headers: OutgoingHttpHeaders;
  readonly body: Buffer | undefined;
}

/**
 * The connections to each gateway's upstream: one keep-alive pool per gateway (undici's), so a
 * request pays no TCP (or TLS) handshake. undici rather than `http.request`: it hands over the
 * response's bytes as they are read, with no stream object per response. A bare proxy spends a
 * fifth less of its time per request with it; in the whole gateway the saving was within the
 * spread of `npm run bench:gateway`'s runs (docs/benchmarks.md).
 */
export class UpstreamPools {
  readonly #pools = new Map<string, Pool>();
  #closed = false;

  #poolOf(gateway: ResolvedGateway): Pool {
    let pool = this.#pools.get(gateway.name);
    if (!pool) {
      const { protocol, hostname, port } = gateway.upstream;
      const host = hostname.includes(':') ? `[${hostname}]` : hostname;
      pool = new Pool(`${protocol}//${host}:${port}`, {
        // No time limit of its own on an answer or between two of its chunks (undici's default
        // is 300 s): a model may think for longer, and the caller, the drain and the slot's
        // lease already bound the request.
        headersTimeout: 0,
        bodyTimeout: 0,
        // Idle connections are kept a minute when the upstream gives no `Keep-Alive: timeout`
        // (undici's default is 4 s, so a quiet tenant would pay a handshake per request). An
        // upstream that closes one sooner races a request at worst, which is sent again.
        keepAliveTimeout: 60_000,
        connect: markingReuse(buildConnector({ timeout: 10_000 })),
      });
      // Once closed, a request still on its way (a retry) meets a closed pool and fails (502).
      if (this.#closed) void pool.destroy().catch(() => undefined);
      else this.#pools.set(gateway.name, pool);
    }
    return pool;
  }

  /** Sends one request; `handler` hears its answer (or its failure) as it comes. */
  dispatch(gateway: ResolvedGateway, request: UpstreamRequest, handler: Dispatcher.DispatchHandler): void {
    this.#poolOf(gateway).dispatch(
      {
        method: request.method as Dispatcher.HttpMethod,
        path: request.path,
        headers: asStrings(request.headers),
        body: request.body ?? null,
      },
      handler,
    );
  }

  close(): void {
    this.#closed = true;
    for (const pool of this.#pools.values()) void pool.destroy().catch(() => undefined);
    this.#pools.clear();
  }
}

/**
 * An error of an upstream socket, marked by the pool's connector (`markingReuse`) with the
 * socket's bytes read: when its first request was written, when the request now on it was
 * written, and when the error came.
 */
export type UpstreamSocketError = Error & {
  code?: string;
  upstreamRead?: { atFirstWrite: number; atWrite: number; atError: number };
};

/**
 * Every socket of the pool marks its errors with its bytes read (see `UpstreamSocketError`):
 * undici hands a reset over as the socket's own error, and a close as its `SocketError`, both
 * through the socket's `error` event, with nothing on them that tells a reused socket from a
 * new one. Counted from the first write, so a TLS handshake's bytes are not taken for an answer.
 */
function markingReuse(connect: buildConnector.connector): buildConnector.connector {
  return (options, callback) =>
    connect(options, (...result) => {
      const socket = result[1];
      if (socket) {
        let atFirstWrite: number | undefined;
        let atWrite = 0;
        const write = socket.write;
        socket.write = function (this: typeof socket, ...args: Parameters<typeof write>) {
          atWrite = socket.bytesRead;
          atFirstWrite ??= atWrite;
          return write.apply(this, args);
        } as typeof write;
        // Added before undici's own listener, so the error it passes on carries the mark.
        socket.on('error', (error: UpstreamSocketError) => {
          error.upstreamRead ??= {
            atFirstWrite: atFirstWrite ?? atWrite,
            atWrite,
            atError: socket.bytesRead,
          };
        });
      }
      callback(...result);
    });
}

/**
 * Whether the upstream cannot have taken the request a socket failed under: the socket had
 * carried answers before the request was written (a kept-alive one, closed by the upstream's
 * idle timeout as the request went out), and nothing of an answer came after it, not even a 1xx.
 */
export const untaken = (error: UpstreamSocketError): boolean => {
  const read = error.upstreamRead;
  return read !== undefined && read.atWrite > read.atFirstWrite && read.atError === read.atWrite;
};

/** undici takes header values as text (or lists of it). */
function asStrings(headers: OutgoingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    out[name] = Array.isArray(value) ? value : String(value);
  }
  return out;
}

/** Headers of which Node's `http` keeps the first when one comes twice. */
const SINGLE = new Set([
  'age',
  'content-length',
  'content-type',
  'etag',
  'expires',
  'last-modified',
  'location',
  'retry-after',
  'server',
]);

/**
 * An upstream's headers (names in lower case, a repeated one as a list) as Node's `http` gives
 * them: one text per name, a repeated one joined with commas or its first kept, `set-cookie`
 * as a list.
 */
export function asIncomingHeaders(
  headers: Record<string, string | string[] | undefined>,
): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (name === 'set-cookie') out[name] = Array.isArray(value) ? value : [value];
    else if (!Array.isArray(value)) out[name] = value;
    else out[name] = SINGLE.has(name) ? value[0] : value.join(', ');
  }
  return out;
}
