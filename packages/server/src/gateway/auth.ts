import type { FastifyRequest } from 'fastify';
import type { CacheStore } from '../cache/store.js';
import { bearerOf, failedAuthKey, failedAuthLimit } from '../http/auth.js';
import type { Principals } from '../http/principals.js';
import type { Principal } from '../store/tokens.js';
import { tenantMayUse, type ResolvedGateway } from './config.js';
import { GatewayError, gatewayForbidden, unauthenticated, unknownGateway } from './errors.js';
import type { Gateways } from './gateways.js';

/** The Sluice token a caller sends: `Authorization: Bearer` (OpenAI clients) or `x-api-key` (Anthropic clients). */
export function callerSecret(headers: FastifyRequest['headers']): string | undefined {
  const bearer = bearerOf(headers.authorization);
  if (bearer) return bearer;
  const key = headers['x-api-key'];
  return typeof key === 'string' && /^\S{1,512}$/.test(key) ? key : undefined;
}

/**
 * Who calls which gateway, decided before the body is read: 401 without a known token (counted
 * against the address with every other failed authentication of the server), 404 for a
 * gateway that does not exist (only once the caller is known, so names cannot be probed
 * without a token), 403 for a read-only token or a tenant not allowed the gateway.
 */
export function gatewayAuth(
  gateways: Gateways,
  principals: Principals,
  cache: CacheStore,
  tenants: Record<string, { gateways?: string[] }> | undefined,
) {
  const refuse = async (request: FastifyRequest, message: string) => {
    const after = await cache.hit(failedAuthKey(request.ip), failedAuthLimit.windowMs);
    if (after.count <= failedAuthLimit.failures) return unauthenticated(message);
    const seconds = Math.max(1, Math.ceil(after.leftMs / 1000));
    return new GatewayError(
      429,
      'too_many_failed_authentications',
      `More than ${failedAuthLimit.failures} failed authentications in a minute from this address; retry in ${seconds} s`,
      { 'retry-after': String(seconds) },
    );
  };
  return async (request: FastifyRequest): Promise<{ principal: Principal; gateway: ResolvedGateway }> => {
    const secret = callerSecret(request.headers);
    if (!secret)
      throw await refuse(
        request,
        'Send a Sluice API token: Authorization: Bearer <token>, or x-api-key: <token>',
      );
    const principal = await principals.find(secret);
    if (!principal) throw await refuse(request, 'Unknown or revoked API token');
    const name = (request.params as { name: string }).name;
    const gateway = gateways.find(name);
    if (!gateway) throw unknownGateway(name);
    if (principal.role === 'read')
      throw new GatewayError(
        403,
        'permission_denied',
        'A read token cannot send provider requests; it needs the member role',
      );
    if (!tenantMayUse(tenants, principal.tenant, gateway.name)) throw gatewayForbidden(gateway.name);
    return { principal, gateway };
  };
}
