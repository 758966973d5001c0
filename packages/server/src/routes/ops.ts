import type { FastifyInstance } from 'fastify';
import type { Store } from '../store/store.js';

/** Routes outside the authenticated API: readiness and the OpenAPI document. */
export function opsRoutes(
  fastify: FastifyInstance,
  options: { store: Store; isDraining: () => boolean; isBeating: () => boolean },
): void {
  // Ready means: taking new work, the database answers, and this process's heartbeat is fresh
  // (one held by a stalled connection would let peers declare its runs lost). A load balancer
  // stops sending work while any is false.
  fastify.get('/readyz', { schema: { hide: true } }, async (_request, reply) => {
    if (options.isDraining()) return reply.status(503).send({ ready: false, reason: 'draining' });
    if (!(await options.store.ping()))
      return reply.status(503).send({ ready: false, reason: 'database unreachable' });
    if (!options.isBeating()) return reply.status(503).send({ ready: false, reason: 'heartbeat late' });
    return { ready: true };
  });
  fastify.get('/api/client/v1/openapi.json', { schema: { hide: true } }, async () => fastify.swagger());
}
