import websocket from '@fastify/websocket';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { WebSocket } from 'ws';
import type { CacheStore } from '../cache/store.js';
import { authenticate, bearerOf } from '../http/auth.js';
import { badRequest } from '../http/errors.js';
import { requestLimits } from '../http/limits.js';
import type { RouteContext } from './context.js';
import { liveRoute } from './live.js';
import { keepAlive, takeConnectionPlaces, upgradeRequired, type SocketSession } from './ws-connections.js';
import { WsSession } from './ws-session.js';

type Log = (level: 'warn' | 'error', message: string, fields?: object) => void;

export type { SocketSession };

/**
 * The WebSocket plugin, with frames capped at the body limit (a longer frame closes the socket
 * with 1009). On close (after a drain has let local runs end), every socket waits until its runs
 * have sent their last frames, then closes with 1001.
 */
export async function installWebsocket(
  fastify: FastifyInstance,
  sessions: Set<SocketSession>,
): Promise<void> {
  await fastify.register(websocket, {
    options: { maxPayload: requestLimits.bodyBytes },
    preClose: async function closeSockets(this: FastifyInstance) {
      await Promise.allSettled([...sessions].map((s) => s.settled()));
      for (const client of this.websocketServer.clients) client.close(1001, 'server shutting down');
      await new Promise<void>((resolve) => this.websocketServer.close(() => resolve()));
    },
  });
}

/** Where the WebSocket route is served; any other route answers an upgrade request with 400. */
export const WS_PATH = '/api/client/v1/ws';
export const LIVE_PATH = '/api/client/v1/live';
const WS_KEY = /^[+/0-9A-Za-z]{22}==$/;

/**
 * An `onRequest` hook after the plugin's: an upgrade request that the WebSocket route will not
 * take is refused here, in the API's error body, instead of by the handshake's plain-text 400
 * (which the plugin would send from any route). The plugin ends the socket after the answer.
 */
export function checkUpgrade(request: FastifyRequest): void {
  if (!(request as FastifyRequest & { ws?: boolean }).ws) return;
  if (request.routeOptions.url !== WS_PATH && request.routeOptions.url !== LIVE_PATH) {
    throw badRequest(
      `WebSocket upgrades are served at ${WS_PATH} and ${LIVE_PATH} only; this route answers plain HTTP requests`,
      {
        param: 'upgrade',
      },
    );
  }
  const key = request.headers['sec-websocket-key'];
  if (typeof key !== 'string' || !WS_KEY.test(key)) {
    throw badRequest('Expected a Sec-WebSocket-Key header of 16 bytes in base64 (RFC 6455)', {
      param: 'sec-websocket-key',
    });
  }
  const version = request.headers['sec-websocket-version'];
  if (version !== '13' && version !== '8') {
    throw badRequest(
      `Expected Sec-WebSocket-Version 13, got ${JSON.stringify(String(version ?? '')).slice(0, 40)}`,
      {
        param: 'sec-websocket-version',
      },
    );
  }
}

/** A token sent as `?access_token=` (browsers cannot set headers on a WebSocket) is read as a bearer token. */
function queryToken(request: FastifyRequest): void {
  if (request.headers.authorization !== undefined) return;
  const token = (request.query as { access_token?: unknown } | undefined)?.access_token;
  if (typeof token === 'string') request.headers.authorization = `Bearer ${token}`;
}

/**
 * `GET /ws`: run and cancel frames over one socket. The token and both connection caps are
 * checked before the upgrade, so a refusal is a plain HTTP answer (401, 429, 503 while
 * draining) in the API's error body. The places taken are freed when the socket closes.
 */
export function wsRoutes(
  api: FastifyInstance,
  ctx: RouteContext,
  sessions: Set<SocketSession>,
  log: Log,
  cache: CacheStore,
): void {
  const auth = authenticate(ctx.principals, cache);
  api.addHook('onRequest', async (request) => {
    queryToken(request);
    await auth(request);
  });
  api.route({
    method: 'GET',
    url: '/ws',
    schema: {
      querystring: {
        type: 'object',
        additionalProperties: false,
        properties: { access_token: { type: 'string', minLength: 1, maxLength: 512 } },
      } as const,
    },
    wsHandler: openSession(ctx, sessions, log),
    preHandler: async (request: FastifyRequest) => {
      // A plain GET takes no place: it is answered 426 below.
      if (request.ws) await takeConnectionPlaces(ctx, request);
    },
    handler: upgradeRequired,
  });
  liveRoute(api, ctx, sessions, log);
}

function openSession(ctx: RouteContext, sessions: Set<SocketSession>, log: Log) {
  return (socket: WebSocket, request: FastifyRequest) => {
    // The upgrade was authenticated, so the header (or the query token copied into it) holds one.
    const secret = bearerOf(request.headers.authorization) ?? '';
    const session = new WsSession(socket, ctx, request.principal, secret, log);
    sessions.add(session);
    keepAlive(socket);
    socket.once('close', () => {
      void session.settled().finally(() => sessions.delete(session));
    });
  };
}
