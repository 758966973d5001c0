import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import type { Dispatcher } from 'undici';
import type { TokenCounts } from 'sluice';
import type { GatewayApi } from './config.js';
import type { GatewayError } from './errors.js';
import { leaseLost, upstreamUnreachable } from './errors.js';
import { callerHeaders, isEventStream } from './headers.js';
import { asIncomingHeaders, untaken, type UpstreamSocketError } from './upstream.js';
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
 * Sends one request upstream (`send` hands `handler` to the pool) and pipes its response to the
 * caller: status, headers, then each chunk as it comes (the caller's socket's backpressure
 * pauses the upstream), reading the usage from a copy. Three things stop it early, each at
 * once: the caller leaving (`cut`), the slot's lease being lost (`lost`), the drain's time
 * running out (`cut` again). Resolves when the response has ended, one way or another; never
 * rejects.
 */
export function pipeExchange(
  send: (handler: Dispatcher.DispatchHandler) => void,
  response: ServerResponse,
  options: {
    api: GatewayApi;
    requestId: string;
    lost?: AbortSignal;
    /** A stale kept-alive socket ends the exchange as `stale` (to be sent again) instead of a 502. */
    staleRetry?: boolean;
    /** The clock `answeredAt` is read from. */
    now?: () => number;
  },
): { done: Promise<ExchangeEnd>; cut: () => void } {
  const { api, requestId, lost } = options;
  let finish!: (end: ExchangeEnd) => void;
  const done = new Promise<ExchangeEnd>((resolve) => (finish = resolve));
  let ended = false;
  let controller: Dispatcher.DispatchController | undefined;
  let status: number | undefined;
  let headers: IncomingHttpHeaders | undefined;
  let answeredAt: number | undefined;
  let wrote = false;
  let usage: ReturnType<typeof jsonUsageReader> | undefined;
  const end = (outcome: ExchangeEnd['outcome'], answered: number) => {
    if (ended) return;
    ended = true;
    lost?.removeEventListener('abort', onLost);
    finish({ outcome, status: answered, headers, answeredAt, usage: usage?.end() });
  };
  // Stops the upstream request: its connection is closed now (or, not yet started, it never
  // is: `onRequestStart` sees it ended).
  const stopUpstream = () => {
    if (controller && !controller.aborted) controller.abort(new Error('the gateway request ended'));
  };
  // The caller left, or the drain cut it off: the upstream request stops in this same turn.
  const cut = () => {
    stopUpstream();
    if (!response.writableFinished) response.destroy();
    end('cancelled', status ?? 499);
  };
  const onLost = () => {
    stopUpstream();
    if (!response.headersSent) writeError(response, api, leaseLost(), requestId);
    else response.destroy();
    end('failed', status ?? 503);
  };
  if (lost?.aborted) queueMicrotask(onLost);
  else lost?.addEventListener('abort', onLost, { once: true });

  send({
    onRequestStart(started) {
      controller = started;
      if (ended) stopUpstream();
    },
    onResponseStart(_controller, statusCode, raw) {
      // An informational answer (103 Early Hints): the real one follows.
      if (ended || statusCode < 200) return;
      status = statusCode;
      headers = asIncomingHeaders(raw);
      answeredAt = options.now?.();
      const stream = isEventStream(headers);
      usage = stream ? sseUsageReader() : jsonUsageReader();
      response.writeHead(statusCode, callerHeaders(headers, requestId, stream));
      // A stream's headers go out before its first event, so a client sees it open: with the
      // events that came in the same read as them (one write), or alone once that read is done.
      if (stream)
        process.nextTick(() => {
          if (!wrote && !ended && !response.destroyed) response.flushHeaders();
        });
    },
    onResponseData(flow, chunk) {
      if (ended || !usage) return;
      wrote = true;
      usage.push(chunk);
      if (!response.write(chunk)) {
        flow.pause();
        response.once('drain', () => flow.resume());
      }
    },
    onResponseEnd() {
      if (ended) return;
      response.end();
      end('completed', status ?? 502);
    },
    onResponseError(_controller, error: UpstreamSocketError) {
      if (ended) return;
      // The upstream cut its response short: the caller's is cut too, so it cannot take a part
      // for the whole.
      if (status !== undefined) {
        response.destroy();
        return end('failed', status);
      }
      // Closed or reset under the request with no byte of an answer, on a socket that had
      // carried answers before: the upstream's idle timeout raced the request, and did not take it.
      const stale = (error.code === 'ECONNRESET' || error.code === 'UND_ERR_SOCKET') && untaken(error);
      if (options.staleRetry && stale && !response.destroyed) {
        ended = true;
        lost?.removeEventListener('abort', onLost);
        finish({ outcome: 'failed', status: 502, headers: undefined, usage: undefined, stale: true });
        return;
      }
      writeError(response, api, upstreamUnreachable(), requestId);
      end('failed', 502);
    },
  });
  return { done, cut };
}
