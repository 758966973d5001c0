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
 * response's bytes as they are read, with no stream object per response, and costs a fifth
 * less of the process's time per request (measured with `npm run bench:gateway`).
 */
export class UpstreamPools {
  readonly #pools = new Map<string, Pool>();

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
        connect: markingReuse(buildConnector({ timeout: 10_000 })),
      });
      this.#pools.set(gateway.name, pool);
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
    for (const pool of this.#pools.values()) void pool.destroy().catch(() => undefined);
    this.#pools.clear();
  }
}

/**
 * An error of an upstream socket, marked with how many bytes the socket had read when it came:
 * more than none means it had carried an answer before (it was reused), since an exchange that
 * fails this way had no answer of its own. undici hands a reset over as the socket's own error,
 * with nothing of the socket on it.
 */
export type UpstreamSocketError = Error & {
  code?: string;
  /** undici's `SocketError` (a close under the request): the socket's figures. */
  socket?: { bytesRead?: number } | null;
  /** Any other error of the socket: its bytes read when the error came (`markingReuse`). */
  bytesReadBefore?: number;
};

function markingReuse(connect: buildConnector.connector): buildConnector.connector {
  return (options, callback) =>
    connect(options, (...result) => {
      const socket = result[1];
      // Added before undici's own listener, so the error it passes on carries the mark.
      socket?.on('error', (error: UpstreamSocketError) => {
        error.bytesReadBefore ??= socket.bytesRead;
      });
      callback(...result);
    });
}

/** Whether an upstream socket that failed had carried an answer before this request. */
export const wasReused = (error: UpstreamSocketError): boolean =>
  (error.socket?.bytesRead ?? error.bytesReadBefore ?? 0) > 0;

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
