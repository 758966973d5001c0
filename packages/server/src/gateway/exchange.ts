import type { ClientRequest, IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { TokenCounts } from 'sluice';
import type { GatewayApi } from './config.js';
import type { GatewayError } from './errors.js';
import { leaseLost, upstreamUnreachable } from './errors.js';
import { callerHeaders, isEventStream } from './headers.js';
import { jsonUsageReader, sseUsageReader } from './usage.js';

/** How one upstream exchange ended. */
export interface ExchangeEnd {
  /** `completed`: the whole response reached the caller; else why it stopped. */
  readonly outcome: 'completed' | 'failed' | 'cancelled';
  /** What the caller was answered: the upstream's status, or the gateway's own. */
  readonly status: number;
  /** The upstream's headers (its rate-limit figures); undefined when it never answered. */
  readonly headers: IncomingHttpHeaders | undefined;
  /** When those headers came, by the `now` given: a streamed answer ends long after them. */
  readonly answeredAt?: number | undefined;
  readonly usage: TokenCounts | undefined;
  /**
   * The upstream closed a kept-alive socket as this request was sent on it, before answering:
   * nothing reached the caller, and the request may be sent again on a new connection.
   */
  readonly stale?: boolean;
}

/** Writes one of the gateway's own errors to a caller that has had no answer yet. */
export function writeError(
  response: ServerResponse,
  api: GatewayApi,
  error: GatewayError,
  requestId: string,
): void {
  if (response.headersSent || response.destroyed) return;
  response.writeHead(error.status, {
    'content-type': 'application/json',
    'x-request-id': requestId,
    ...error.headers,
  });
  response.end(JSON.stringify(error.body(api)));
}

/**
 * Pipes one upstream response to the caller: status, headers, then each chunk as it comes
 * (the caller's socket's backpressure pauses the upstream), reading the usage from a copy.
 * Three things stop it early, each at once: the caller leaving (`cut`), the slot's lease
 * being lost (`lost`), the drain's time running out (`cut` again). Resolves when the response
 * has ended, one way or another; never rejects.
 */
export function pipeExchange(
  upstream: ClientRequest,
  response: ServerResponse,
  options: {
    api: GatewayApi;
    requestId: string;
    lost?: AbortSignal;
    body: Buffer | undefined;
    /** A stale kept-alive socket ends the exchange as `stale` (to be sent again) instead of a 502. */
    staleRetry?: boolean;
    /** The clock `answeredAt` is read from. */
    now?: () => number;
  },
): { done: Promise<ExchangeEnd>; cut: () => void; answered: () => boolean } {
  const { api, requestId, lost } = options;
  let finish!: (end: ExchangeEnd) => void;
  const done = new Promise<ExchangeEnd>((resolve) => (finish = resolve));
  let ended = false;
  let reply: IncomingMessage | undefined;
  let answeredAt: number | undefined;
  let usage: ReturnType<typeof jsonUsageReader> | undefined;
  const end = (outcome: ExchangeEnd['outcome'], status: number) => {
    if (ended) return;
    ended = true;
    lost?.removeEventListener('abort', onLost);
    finish({ outcome, status, headers: reply?.headers, answeredAt, usage: usage?.end() });
  };
  // The caller left, or the drain cut it off: the upstream request stops in this same turn.
  const cut = () => {
    upstream.destroy();
    if (!response.writableFinished) response.destroy();
    end('cancelled', reply?.statusCode ?? 499);
  };
  const onLost = () => {
    upstream.destroy();
    if (!response.headersSent) writeError(response, api, leaseLost(), requestId);
    else response.destroy();
    end('failed', reply?.statusCode ?? 503);
  };
  if (lost?.aborted) queueMicrotask(onLost);
  else lost?.addEventListener('abort', onLost, { once: true });

  upstream.on('response', (incoming) => {
    if (ended) return void incoming.destroy();
    reply = incoming;
    answeredAt = options.now?.();
    const stream = isEventStream(incoming.headers);
    usage = stream ? sseUsageReader() : jsonUsageReader();
    const reader = usage;
    response.writeHead(incoming.statusCode ?? 502, callerHeaders(incoming.headers, requestId, stream));
    // The headers go out now, before the first event: a client sees the stream open.
    if (stream) response.flushHeaders();
    incoming.on('data', (chunk: Buffer) => {
      reader.push(chunk);
      if (!response.write(chunk)) {
        incoming.pause();
        response.once('drain', () => incoming.resume());
      }
    });
    incoming.once('end', () => {
      if (ended) return;
      response.end();
      end('completed', incoming.statusCode ?? 502);
    });
    // The upstream cut its response short: the caller's is cut too, so it cannot take a part
    // for the whole.
    incoming.once('aborted', () => {
      response.destroy();
      end('failed', incoming.statusCode ?? 502);
    });
    incoming.once('error', () => {
      response.destroy();
      end('failed', incoming.statusCode ?? 502);
    });
  });
  upstream.once('error', (error: NodeJS.ErrnoException) => {
    if (ended) return;
    if (
      options.staleRetry &&
      upstream.reusedSocket &&
      reply === undefined &&
      error.code === 'ECONNRESET' &&
      !response.destroyed
    ) {
      ended = true;
      lost?.removeEventListener('abort', onLost);
      finish({ outcome: 'failed', status: 502, headers: undefined, usage: undefined, stale: true });
      return;
    }
    if (!response.headersSent) writeError(response, api, upstreamUnreachable(), requestId);
    else response.destroy();
    end('failed', reply?.statusCode ?? 502);
  });
  upstream.end(options.body);
  return { done, cut, answered: () => reply !== undefined };
}
