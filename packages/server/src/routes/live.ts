import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { WebSocket } from 'ws';
import { agentFor } from '../config.js';
import { bearerOf, requireRole } from '../http/auth.js';
import { draining, notFound, shown } from '../http/errors.js';
import { threadIdSchema } from '../http/schemas.js';
import { RunRefusedError } from '../runs/refused.js';
import { getThread } from '../threads/store.js';
import type { RouteContext } from './context.js';
import { LiveSession } from './live-session.js';
import { keepAlive, takeConnectionPlaces, upgradeRequired, type SocketSession } from './ws-connections.js';
import type { Log } from './ws-session.js';

interface LiveQuery {
  agent: string;
  thread_id: string;
  access_token?: string;
}

/**
 * `GET /live?agent=NAME&thread_id=ID`: a WebSocket bound to one thread, each input frame a turn
 * (./live-session.ts). Everything the upgrade can be refused for is checked before it, as on
 * `/ws`, so a refusal is a plain HTTP answer in the API's error body: the token (the scope's
 * hook), the role, 503 while draining, 404 for an agent or a thread the tenant does not have,
 * then both connection caps, under which the session counts like any socket.
 */
export function liveRoute(
  api: FastifyInstance,
  ctx: RouteContext,
  sessions: Set<SocketSession>,
  log: Log,
): void {
  api.route<{ Querystring: LiveQuery }>({
    method: 'GET',
    url: '/live',
    schema: {
      querystring: {
        type: 'object',
        additionalProperties: false,
        required: ['agent', 'thread_id'],
        properties: {
          agent: { type: 'string', minLength: 1, maxLength: 64 },
          thread_id: threadIdSchema,
          access_token: { type: 'string', minLength: 1, maxLength: 512 },
        },
      } as const,
    },
    wsHandler: (socket: WebSocket, request: FastifyRequest<{ Querystring: LiveQuery }>) => {
      const secret = bearerOf(request.headers.authorization) ?? '';
      const { agent, thread_id: threadId } = request.query;
      const session = new LiveSession(socket, ctx, request.principal, secret, { agent, threadId }, log);
      sessions.add(session);
      keepAlive(socket);
      socket.once('close', () => void session.settled().finally(() => sessions.delete(session)));
    },
    preHandler: async (request) => {
      if (!request.ws) return;
      const who = request.principal;
      requireRole(who, 'member', 'create runs');
      if (ctx.isDraining()) throw draining();
      const { agent, thread_id: threadId } = request.query;
      if (!agentFor(ctx.config, who.tenant, agent)) throw notFound(`No agent \`${shown(agent)}\``);
      // Another tenant's thread is not found, as on the runs API.
      if (!(await getThread(ctx.db, who.tenant, threadId))) {
        throw new RunRefusedError({ kind: 'thread_missing', threadId });
      }
      await takeConnectionPlaces(ctx, request);
    },
    handler: upgradeRequired,
  });
}
