import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { ResolvedGateway } from './config.js';

/** Headers of one connection, not of the message (RFC 9110 section 7.6.1), and `Host`. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
  'http2-settings',
]);

/**
 * What a caller sends that never goes upstream: its Sluice credentials (the gateway sends its
 * own key), its cookies, the length (the body is sent again, with its own length), `Expect`
 * (answered here), and `Accept-Encoding`: the upstream answers uncompressed, so the copy the
 * usage is read from is plain text (the cost is bytes on the upstream link, not time here).
 */
const CALLER_ONLY = new Set([
  'authorization',
  'x-api-key',
  'cookie',
  'content-length',
  'expect',
  'accept-encoding',
]);

/** What an upstream sends that is not for the caller: cookies of the provider's domain. */
const UPSTREAM_ONLY = new Set(['set-cookie', 'content-length']);

/** The header names a `Connection` header lists: hop-by-hop too. */
function listedIn(connection: string | string[] | undefined): Set<string> | undefined {
  if (connection === undefined) return undefined;
  const text = Array.isArray(connection) ? connection.join(',') : connection;
  const names = text
    .split(',')
    .map((name) => name.trim().toLowerCase())
    .filter((name) => name !== '' && name !== 'close' && name !== 'keep-alive');
  return names.length === 0 ? undefined : new Set(names);
}

/** The headers of the upstream request: the caller's, less the above, with the gateway's key. */
export function upstreamHeaders(
  gateway: ResolvedGateway,
  incoming: IncomingHttpHeaders,
  bodyLength: number | undefined,
): OutgoingHttpHeaders {
  const listed = listedIn(incoming.connection);
  const out: OutgoingHttpHeaders = {};
  for (const name in incoming) {
    if (HOP_BY_HOP.has(name) || CALLER_ONLY.has(name) || listed?.has(name)) continue;
    out[name] = incoming[name];
  }
  out.host = gateway.upstream.host;
  if (bodyLength !== undefined) out['content-length'] = bodyLength;
  if (gateway.api === 'anthropic') out['x-api-key'] = gateway.apiKey;
  else out.authorization = `Bearer ${gateway.apiKey}`;
  return out;
}

/**
 * The headers of the answer to the caller: the upstream's, less hop-by-hop ones and cookies.
 * A stream gets `X-Accel-Buffering: no`, so a proxy in front (nginx) passes each event on as
 * it comes. The length is kept for a body that is not a stream (the body goes out as it came).
 */
export function callerHeaders(
  incoming: IncomingHttpHeaders,
  requestId: string,
  stream: boolean,
): OutgoingHttpHeaders {
  const listed = listedIn(incoming.connection);
  const out: OutgoingHttpHeaders = {};
  for (const name in incoming) {
    if (HOP_BY_HOP.has(name) || UPSTREAM_ONLY.has(name) || listed?.has(name)) continue;
    out[name] = incoming[name];
  }
  if (!stream && incoming['content-length'] !== undefined && incoming['transfer-encoding'] === undefined)
    out['content-length'] = incoming['content-length'];
  if (stream) {
    out['x-accel-buffering'] = 'no';
    out['cache-control'] ??= 'no-cache';
  }
  out['x-request-id'] = requestId;
  return out;
}

/** Whether a response is a server-sent event stream. */
export const isEventStream = (headers: IncomingHttpHeaders) =>
  headers['content-type']?.toLowerCase().startsWith('text/event-stream') === true;
