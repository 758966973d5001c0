import type { FastifyRequest } from 'fastify';
import type { Database } from '@sluice/postgres/database';
import { findToken, type Principal, type Role } from '../store/tokens.js';
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

/** An `onRequest` hook: the token's principal on the request, or 401 before the body is read. */
export function authenticate(db: Database) {
  return async (request: FastifyRequest) => {
    const secret = bearerOf(request.headers.authorization);
    if (!secret) throw unauthenticated('Send an API token: Authorization: Bearer <token>');
    const principal = await findToken(db, secret);
    if (!principal) throw unauthenticated('Unknown or revoked API token');
    request.principal = principal;
  };
}

const rank: Record<Role, number> = { read: 0, member: 1, admin: 2 };

/** Refuses a principal below `role` (403; nothing about the target is looked up first). */
export function requireRole(who: Principal, role: Role, action: string): void {
  if (rank[who.role] < rank[role])
    throw forbidden(`A ${who.role} token cannot ${action}; it needs the ${role} role`);
}
