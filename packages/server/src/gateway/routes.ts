import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { CacheStore } from '../cache/store.js';
import { HttpError } from '../http/errors.js';
import { requestLimits } from '../http/limits.js';
import type { Principals } from '../http/principals.js';
import { gatewayAuth } from './auth.js';
import type { ResolvedGateway } from './config.js';
import { apiOfHeaders, bodyTooLarge, GatewayError } from './errors.js';
import type { Gateways } from './gateways.js';
import { upstreamPath } from './path.js';

declare module 'fastify' {
  interface FastifyRequest {
    gateway?: ResolvedGateway;
  }
}

/** Any error of the gateway's routes as the gateway's own answer, in its API's shape. */
function asGatewayError(error: FastifyError | HttpError | GatewayError): GatewayError {
  if (error instanceof GatewayError) return error;
  // The server's own refusals that reach these routes: 503 while draining, above all.
  if (error instanceof HttpError)
    return new GatewayError(error.status, error.type, error.message, error.headers);
  switch (error.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return bodyTooLarge(requestLimits.bodyBytes);
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return new GatewayError(400, 'invalid_request', 'The body is not as long as its Content-Length says');
    case 'FST_ERR_BAD_URL':
      return new GatewayError(
        400,
        'invalid_request',
        'The URL is not valid: a percent-encoded part of it is not UTF-8',
      );
  }
  const status = error.statusCode ?? 500;
  if (status >= 400 && status < 500) return new GatewayError(status, 'invalid_request', error.message);
  return new GatewayError(500, 'internal_error', 'internal error');
}

/**
 * `/api/client/v1/gateway/:name/*`, every method, in a scope of its own: the body is taken as
 * bytes whatever its type (it is forwarded as it came), up to the API's 10 MB (a larger
 * declared `Content-Length` is refused before the body is read), and every error is answered
 * in the error shape of the gateway's API.
 */
export function gatewayRoutes(
  gateways: Gateways,
  deps: {
    principals: Principals;
    cache: CacheStore;
    tenants: Record<string, { gateways?: string[] }> | undefined;
    onError: (request: FastifyRequest, error: unknown) => void;
  },
) {
  const authenticate = gatewayAuth(gateways, deps.principals, deps.cache, deps.tenants);
  return async (api: FastifyInstance) => {
    api.removeAllContentTypeParsers();
    api.addContentTypeParser(
      '*',
      { parseAs: 'buffer', bodyLimit: requestLimits.bodyBytes },
      (_r, body, done) => done(null, body),
    );
    api.setErrorHandler((error: FastifyError | HttpError | GatewayError, request, reply) => {
      const answer = asGatewayError(error);
      if (answer.status >= 500 && !(error instanceof HttpError)) deps.onError(request, error);
      const gateway = request.gateway ?? gateways.find((request.params as { name?: string })?.name ?? '');
      const body = answer.body(gateway?.api ?? apiOfHeaders(request.headers));
      return reply.status(answer.status).headers(answer.headers).send(body);
    });
    api.addHook('onRequest', async (request: FastifyRequest) => {
      const { principal, gateway } = await authenticate(request);
      request.principal = principal;
      request.gateway = gateway;
    });
    api.route({
      method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'],
      url: '/gateway/:name/*',
      schema: { hide: true },
      handler: async (request: FastifyRequest, reply: FastifyReply) => {
        const gateway = request.gateway!;
        const path = upstreamPath(request.raw.url ?? '', gateway.upstream.basePath);
        reply.hijack();
        await gateways.forward({
          gateway,
          tenant: request.principal.tenant,
          requestId: request.id,
          request: request.raw,
          response: reply.raw,
          path,
          body: Buffer.isBuffer(request.body) ? request.body : undefined,
        });
      },
    });
  };
}
