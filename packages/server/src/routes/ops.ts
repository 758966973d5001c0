import type { FastifyInstance } from 'fastify';
import type { Store } from '../store/store.js';

/** Routes outside the authenticated API: readiness and the OpenAPI document. */
export function opsRoutes(
  fastify: FastifyInstance,
  options: { store: Store; isDraining: () => boolean },
): void {
  // Ready means: taking new work, and the database answers. A load balancer stops sending work
  // while either is false.
  fastify.get('/readyz', { schema: { hide: true } }, async (_request, reply) => {
    if (options.isDraining()) return reply.status(503).send({ ready: false, reason: 'draining' });
    if (!(await options.store.ping()))
      return reply.status(503).send({ ready: false, reason: 'database unreachable' });
    return { ready: true };
  });
  fastify.get('/api/client/v1/openapi.json', { schema: { hide: true } }, async () => fastify.swagger());
}
