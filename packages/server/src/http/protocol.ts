import {
  STATUS_CODES,
  maxHeaderSize,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { FastifyError, FastifyHttpOptions, FastifyInstance, FastifyReply } from 'fastify';
import { frameworkError } from './error-handling.js';
import { HttpError, badRequest, notFound, shown } from './errors.js';
import { onRequestCheck } from './hooks.js';

/**
 * Requests that fail below the routes: bytes that are not HTTP, headers over Node's limit, an
 * `Expect` Node does not handle, a URL the router cannot decode, a method Node does not hand on.
 * Node and Fastify answer these themselves, each in its own body; these handlers answer them in
 * the API's error shape, so a client has one shape to read whatever it sent.
 */

/** The text of a whole response, for handlers that only have the socket. */
function rawResponse(error: HttpError): string {
  const body = JSON.stringify(error.body());
  const headers: Record<string, string | number> = {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
    ...error.headers,
  };
  const head = Object.entries(headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('');
  return `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status] ?? ''}\r\n${head}\r\n${body}`;
}

/** Node's parser refused the request (malformed, headers too large, timed out). */
function clientErrorHandler(error: Error & { code?: string; reason?: unknown }, socket: Duplex): void {
  // A reset or destroyed socket has nobody left to answer.
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  let mapped: HttpError;
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    mapped = new HttpError(408, 'request_timeout', 'The request was not received in time');
  } else if (error.code === 'HPE_HEADER_OVERFLOW') {
    mapped = new HttpError(
      431,
      'request_too_large',
      `The request's headers are over the limit of ${maxHeaderSize} bytes`,
      { limit: 'header_bytes', limit_value: maxHeaderSize },
    );
  } else {
    // llhttp's reason names the rule broken, never the client's bytes.
    const reason = typeof error.reason === 'string' ? `: ${error.reason}` : '';
    mapped = badRequest(`The request is not valid HTTP/1.1${reason}`);
  }
  // As Node does: never write into a response that has begun.
  const inFlight = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (socket.writable && !inFlight?.headersSent) socket.write(rawResponse(mapped));
  socket.destroy(error);
}

/** Fastify options for the failures it answers outside the error handler. */
export const protocolOptions = {
  clientErrorHandler,
  // Routing failures (an undecodable URL, a path parameter past maxParamLength) in our body.
  frameworkErrors: (error: FastifyError, _request: unknown, reply: unknown) => {
    const mapped = frameworkError(error);
    void (reply as FastifyReply).status(mapped.status).headers(mapped.headers).send(mapped.body());
  },
  // Node would answer a Host-less HTTP/1.1 request itself, with an empty body; the hook in
  // installProtocolHandling refuses it in the API shape instead.
  http: { requireHostHeader: false },
} satisfies Partial<FastifyHttpOptions<Server>>;

/** Server listeners and the hook that go with `protocolOptions`; call before the routes. */
export function installProtocolHandling(fastify: FastifyInstance): void {
  // Node answers any Expect but 100-continue with an empty 417 when nothing listens here.
  fastify.server.on('checkExpectation', (_request: IncomingMessage, response: ServerResponse) => {
    const error = new HttpError(417, 'invalid_request', 'Only `Expect: 100-continue` is supported', {
      field: 'expect',
    });
    response.writeHead(error.status, {
      'content-type': 'application/json; charset=utf-8',
      connection: 'close',
    });
    response.end(JSON.stringify(error.body()));
  });
  // CONNECT never reaches the routes: without this listener Node drops the socket unanswered.
  fastify.server.on('connect', (request: IncomingMessage, socket: Socket) => {
    // The socket is ours now, paused and with no timeout: read it to its end, then let it go.
    socket.on('error', () => undefined);
    socket.once('end', () => socket.destroy());
    socket.setTimeout(10_000, () => socket.destroy());
    socket.resume();
    socket.end(rawResponse(notFound(`No route CONNECT ${shown(request.url, 200)}`)));
  });
  fastify.addHook(
    'onRequest',
    onRequestCheck((request) => {
      if (request.raw.httpVersion === '1.1' && request.headers.host === undefined)
        throw badRequest('An HTTP/1.1 request needs a Host header', { field: 'host' });
    }),
  );
}
