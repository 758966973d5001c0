/**
 * The Fastify route a team writes in front of a job queue: a JSON schema for the body (as
 * Fastify's docs recommend), one enqueue call, 202 with the job's id. No authentication: the
 * peers are spared the token check Sluice makes on every request.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { inputOf, type SystemReady } from './options.js';

const body = {
  type: 'object',
  required: ['tenant', 'input'],
  additionalProperties: false,
  properties: { tenant: { type: 'string', maxLength: 64 }, input: { type: 'string', maxLength: 10_000 } },
} as const;

export interface RunJob {
  tenant: string;
  input: string;
}

export async function startPeerRoute(
  tenants: string[],
  enqueue: (job: RunJob) => Promise<string | null>,
): Promise<{ app: FastifyInstance; ready: SystemReady }> {
  const app = Fastify();
  app.post<{ Body: RunJob }>('/runs', { schema: { body } }, async (request, reply) => {
    const id = await enqueue(request.body);
    return reply.code(202).send({ id });
  });
  const base = await app.listen({ port: 0, host: '127.0.0.1' });
  const headers = Object.fromEntries(tenants.map((t) => [t, { 'content-type': 'application/json' }]));
  const bodies = Object.fromEntries(
    tenants.map((t) => [t, JSON.stringify({ tenant: t, input: inputOf(t) })]),
  );
  return { app, ready: { url: `${base}/runs`, headers, bodies, status: 202 } };
}

/**
 * The peers' nearest feature to a running cap of N per tenant is a set of N serial lanes per
 * tenant (graphile-worker's `queueName`, pg-boss's singleton key): the route deals a tenant's
 * jobs round-robin over its lanes. The counter lives in this process, as it would in one API
 * server.
 */
export function laneDealer(cap: number): (tenant: string) => string {
  const next = new Map<string, number>();
  return (tenant) => {
    const n = next.get(tenant) ?? 0;
    next.set(tenant, n + 1);
    return `${tenant}:${n % cap}`;
  };
}
