import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Principals } from '../http/principals.js';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { CacheStore } from '../cache/store.js';
import { bearerOf, failedAuthentication, requireRole } from '../http/auth.js';
import type { Ops } from '../ops/index.js';

/** The dashboard's files, shipped in the package beside `sql/` (see package.json `files`). */
const staticDir = new URL('../../static/dashboard/', import.meta.url);

const digest = (value: string) => createHash('sha256').update(value).digest();

/**
 * Who reads the operating figures: the operator, holding the `SLUICE_METRICS_TOKEN` secret (for
 * a Prometheus that has no API token), sees every tenant; an admin token sees its own tenant's
 * runs and refusals beside the shared limiters. An admin's tenant is not the server's operator,
 * so other tenants' names and counts stay out of its view.
 */
export type OpsReader = { kind: 'operator' } | { kind: 'tenant'; tenant: string };

/**
 * An `onRequest` hook that lets in a reader (`readerOf` tells which) or refuses: 401 without a
 * known secret, 403 for a token below admin. Digests are compared, so the comparison takes the same time whatever
 * the length or the first wrong byte of what was sent.
 */
function opsAuth(
  principals: Principals,
  cache: CacheStore,
  metricsToken: string | undefined,
  action: string,
) {
  const fail = failedAuthentication(cache);
  const expected = metricsToken === undefined ? undefined : digest(metricsToken);
  const readers = new WeakMap<FastifyRequest, OpsReader>();
  const hook = async (request: FastifyRequest) => {
    const secret = bearerOf(request.headers.authorization);
    if (!secret)
      throw await fail(request, 'Send the metrics token or an admin token: Authorization: Bearer <token>');
    if (expected && timingSafeEqual(digest(secret), expected)) {
      readers.set(request, { kind: 'operator' });
      return;
    }
    const principal = await principals.find(secret);
    if (!principal) throw await fail(request, 'Unknown or revoked token');
    requireRole(principal, 'admin', action);
    readers.set(request, { kind: 'tenant', tenant: principal.tenant });
  };
  return { hook, readerOf: (request: FastifyRequest) => readers.get(request)! };
}

/** Checks SLUICE_METRICS_TOKEN: a short secret would be guessed, so it fails the start. */
export function metricsTokenOf(env: NodeJS.ProcessEnv): string | undefined {
  const raw = env.SLUICE_METRICS_TOKEN;
  if (raw === undefined || raw === '') return undefined;
  if (raw.length < 16 || raw.length > 512 || /\s/.test(raw)) {
    // The value is a secret: its length is said, never the value.
    throw new TypeError(
      `Expected SLUICE_METRICS_TOKEN to be 16 to 512 characters without spaces, got ${raw.length} characters`,
    );
  }
  return raw;
}

/**
 * The page gets nothing secret and loads nothing from elsewhere; the script asks for the token
 * and sends it as a header to the overview route. The policy below makes the browser refuse
 * any other origin, inline script, framing and form posts.
 */
const pageHeaders = {
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-cache',
};

const files = [
  { path: '/dashboard', file: 'index.html', type: 'text/html; charset=utf-8' },
  { path: '/dashboard/dashboard.js', file: 'dashboard.js', type: 'text/javascript; charset=utf-8' },
  { path: '/dashboard/dashboard.css', file: 'dashboard.css', type: 'text/css; charset=utf-8' },
] as const;

/**
 * `GET /metrics`, the dashboard's files and `GET /api/client/v1/ops/overview`. The overview is
 * registered here, not with the API's routes, because the metrics token is not an API token.
 */
export function metricsRoutes(
  fastify: FastifyInstance,
  options: { principals: Principals; cache: CacheStore; ops: Ops; metricsToken: string | undefined },
): void {
  const { ops, principals, cache, metricsToken } = options;
  fastify.get(
    '/metrics',
    { schema: { hide: true }, onRequest: opsAuth(principals, cache, metricsToken, 'read the metrics').hook },
    async (_request, reply) => {
      const text = await ops.metrics.render();
      return reply.header('content-type', ops.metrics.contentType).send(text);
    },
  );
  const overviewAuth = opsAuth(principals, cache, metricsToken, 'read the operating overview');
  fastify.get(
    '/api/client/v1/ops/overview',
    {
      schema: { summary: 'Limiter slots, runs per tenant, class and status, recent refusals (admin)' },
      onRequest: overviewAuth.hook,
    },
    async (request, reply) => {
      const reader = overviewAuth.readerOf(request);
      reply.header('cache-control', 'no-store');
      return ops.overview(reader.kind === 'tenant' ? reader.tenant : undefined);
    },
  );
  for (const { path, file, type } of files) {
    // Read once at start: a missing file is a broken package, found before the first visit.
    const body = readFileSync(new URL(file, staticDir));
    fastify.get(path, { schema: { hide: true } }, async (_request, reply: FastifyReply) =>
      reply.headers({ ...pageHeaders, 'content-type': type }).send(body),
    );
  }
}
