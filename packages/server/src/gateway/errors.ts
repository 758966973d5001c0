import type { GatewayApi } from './config.js';

/** Anthropic's error `type` for each status the gateway answers itself. */
const anthropicTypes: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
};

/**
 * An answer the gateway gives itself (not the upstream's): its status, a code that says which
 * rule refused, a message and headers. Its body is in the error shape of the gateway's API, so
 * the caller's own SDK raises the error class it has for the status.
 */
export class GatewayError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    // An answer, not a fault: no stack (as HttpError, for the same cost reason).
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    super(message);
    Error.stackTraceLimit = limit;
  }

  /** OpenAI: `{ error: { message, type, code, param } }`; Anthropic: `{ type: 'error', error: { type, message } }`. */
  body(api: GatewayApi): unknown {
    if (api === 'anthropic')
      return {
        type: 'error',
        error: { type: anthropicTypes[this.status] ?? 'api_error', message: this.message },
      };
    return { error: { message: this.message, type: this.code, code: this.code, param: null } };
  }
}

export const unauthenticated = (message: string) =>
  new GatewayError(401, 'authentication_required', message, { 'www-authenticate': 'Bearer' });

export const gatewayForbidden = (name: string) =>
  new GatewayError(403, 'permission_denied', `This tenant may not use gateway \`${name}\``);

export const unknownGateway = (name: string) =>
  new GatewayError(404, 'not_found', `No gateway \`${name.length > 64 ? `${name.slice(0, 61)}...` : name}\``);

export const badPath = (why: string) => new GatewayError(400, 'invalid_request', `The path ${why}`);

export const bodyTooLarge = (limit: number, declared?: number) =>
  new GatewayError(
    413,
    'request_too_large',
    declared === undefined
      ? `The request body is over the limit of ${limit / (1024 * 1024)} MB`
      : `The request body of ${declared} bytes is over the limit of ${limit / (1024 * 1024)} MB`,
    { connection: 'close' },
  );

/** A slot that did not come in time, or a full queue: the caller's SDK backs off and retries. */
export const noSlot = (message: string, retryAfterS: number) =>
  new GatewayError(429, 'rate_limit_exceeded', message, { 'retry-after': String(retryAfterS) });

export const limiterFailed = (limiter: string) =>
  new GatewayError(
    503,
    'limiter_unavailable',
    `The limiter \`${limiter}\` cannot be reached; try again shortly`,
    {
      'retry-after': '1',
    },
  );

export const gatewayDraining = () =>
  new GatewayError(503, 'server_draining', 'This server is shutting down; send the request to another one', {
    'retry-after': '1',
  });

export const upstreamUnreachable = () =>
  new GatewayError(
    502,
    'upstream_unreachable',
    'The upstream provider could not be reached or cut the connection',
  );

export const leaseLost = () =>
  new GatewayError(
    503,
    'slot_lost',
    "The request's slot of the limiter was lost; the upstream request was stopped",
    { 'retry-after': '1' },
  );

/** The API an error goes out in when no gateway is known: an Anthropic client sends `x-api-key` or `anthropic-version`. */
export function apiOfHeaders(headers: Record<string, string | string[] | undefined>): GatewayApi {
  return headers['anthropic-version'] !== undefined ||
    (headers['x-api-key'] !== undefined && headers.authorization === undefined)
    ? 'anthropic'
    : 'openai';
}
