import type { FastifyRequest } from 'fastify';
import type { CacheStore } from '../cache/store.js';
import type { Principal, Role } from '../store/tokens.js';
import type { Principals } from './principals.js';
import { rateLimitFields } from './rate-limit-fields.js';
import { HttpError, forbidden } from './errors.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal;
  }
}

const unauthenticated = (message: string) =>
  new HttpError(401, 'authentication_required', message, {}, { 'www-authenticate': 'Bearer' });

/** The secret of an `Authorization: Bearer <token>` header; the scheme is matched in any case (RFC 9110). */
export function bearerOf(header: string | undefined): string | undefined {
  const match = header === undefined ? null : /^bearer[ \t]+(\S{1,512})[ \t]*$/i.exec(header);
  return match?.[1];
}

/** Failed authentications one client address may have in a window before it gets 429. */
export const failedAuthLimit = { failures: 20, windowMs: 60_000 } as const;

/** The cache store's key of an address's failed authentications. */
export const failedAuthKey = (address: string) => `authfail:${address}`;

const tooManyFailures = (leftMs: number) => {
  const seconds = Math.max(1, Math.ceil(leftMs / 1000));
  return new HttpError(
    429,
    'too_many_failed_authentications',
    `More than ${failedAuthLimit.failures} failed authentications in a minute from this address; retry in ${seconds} s`,
    { limit: failedAuthLimit.failures, window_seconds: failedAuthLimit.windowMs / 1000 },
    {
      'retry-after': String(seconds),
      ...rateLimitFields('failed_authentications', {
        limit: failedAuthLimit.failures,
        remaining: 0,
        seconds,
        windowSeconds: failedAuthLimit.windowMs / 1000,
      }),
    },
  );
};

/**
 * An `onRequest` hook: the token's principal on the request, or 401 before the body is read.
 * The token is looked up through `Principals`: the database, or a recent lookup while revocation
 * notifications arrive, so a revocation holds on every server process at once.
 *
 * Failures are counted per client address (`request.ip`: the socket's, or the proxy's view
 * when SLUICE_TRUST_PROXY_HOPS is set) in the cache store; past the limit, a failure is
 * answered 429 instead of 401. A good token is still let in: clients behind one NAT, or behind
 * a proxy the server was not told about, are not locked out by another client's failures, and
 * a right guess is no easier for it (a token is 192 random bits).
 */
export function authenticate(principals: Principals, cache: CacheStore) {
  const fail = failedAuthentication(cache);
  return async (request: FastifyRequest) => {
    const secret = bearerOf(request.headers.authorization);
    if (!secret) throw await fail(request, 'Send an API token: Authorization: Bearer <token>');
    const principal = await principals.find(secret);
    if (!principal) throw await fail(request, 'Unknown or revoked API token');
    request.principal = principal;
  };
}

/**
 * The answer to a failed authentication, counted against the client's address: `refusal`, or
 * 429 past the limit. Every route that checks a credential (a token, a webhook's signature)
 * answers its failures through it, so guesses at any of them share one budget per address.
 */
export function countedRefusal(cache: CacheStore) {
  return async (request: FastifyRequest, refusal: HttpError): Promise<HttpError> => {
    const after = await cache.hit(failedAuthKey(request.ip), failedAuthLimit.windowMs);
    if (after.count > failedAuthLimit.failures) return tooManyFailures(after.leftMs);
    return refusal;
  };
}

/** A failed bearer-token authentication: 401 with `message`, counted as `countedRefusal` does. */
export function failedAuthentication(cache: CacheStore) {
  const count = countedRefusal(cache);
  return (request: FastifyRequest, message: string) => count(request, unauthenticated(message));
}

const rank: Record<Role, number> = { read: 0, member: 1, admin: 2 };

/** Refuses a principal below `role` (403; nothing about the target is looked up first). */
export function requireRole(who: Principal, role: Role, action: string): void {
  if (rank[who.role] < rank[role])
    throw forbidden(`A ${who.role} token cannot ${action}; it needs the ${role} role`);
}
