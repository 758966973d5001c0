import websocket from '@fastify/websocket';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { WebSocket } from 'ws';
import { placeKeys } from '../cache/places.js';
import type { CacheStore } from '../cache/store.js';
import { authenticate, bearerOf } from '../http/auth.js';
import { HttpError, badRequest } from '../http/errors.js';
import { requestLimits } from '../http/limits.js';
import type { RouteContext } from './context.js';
import { WsSession } from './ws-session.js';
import { tuning } from '../tuning.js';

/** Seconds a client refused a connection should wait before it tries again. */
const CONNECTION_RETRY_AFTER_S = 30;
const PING_EVERY_MS = tuning.wsPingEveryMs;

type Log = (level: 'warn' | 'error', message: string, fields?: object) => void;

/**
 * The WebSocket plugin, with frames capped at the body limit (a longer frame closes the socket
 * with 1009). On close (after a drain has let local runs end), every socket waits until its runs
 * have sent their last frames, then closes with 1001.
 */
export async function installWebsocket(fastify: FastifyInstance, sessions: Set<WsSession>): Promise<void> {
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
const WS_KEY = /^[+/0-9A-Za-z]{22}==$/;

/**
 * An `onRequest` hook after the plugin's: an upgrade request that the WebSocket route will not
 * take is refused here, in the API's error body, instead of by the handshake's plain-text 400
 * (which the plugin would send from any route). The plugin ends the socket after the answer.
 */
export function checkUpgrade(request: FastifyRequest): void {
  if (!(request as FastifyRequest & { ws?: boolean }).ws) return;
  if (request.routeOptions.url !== WS_PATH) {
    throw badRequest(
      `WebSocket upgrades are served at ${WS_PATH} only; this route answers plain HTTP requests`,
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

const connectionLimit = (scope: 'user' | 'server', limit: number, active: number) =>
  new HttpError(
    429,
    'websocket_connection_limit',
    `The ${scope} already has ${active} open WebSocket connections; the limit is ${limit}`,
    {
      limit: scope === 'user' ? 'max_connections_per_user' : 'max_connections',
      limit_value: limit,
      scope,
      active,
    },
    { 'retry-after': String(CONNECTION_RETRY_AFTER_S) },
  );

/**
 * `GET /ws`: run and cancel frames over one socket. The token and both connection caps are
 * checked before the upgrade, so a refusal is a plain HTTP answer (401, 429, 503 while
 * draining) in the API's error body. The places taken are freed when the socket closes.
 */
export function wsRoutes(
  api: FastifyInstance,
  ctx: RouteContext,
  sessions: Set<WsSession>,
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
      if (!request.ws) return;
      const who = request.principal;
      const { wsMaxConnectionsPerUser: perUser, wsMaxConnections: all } = ctx.settings;
      const mine = await ctx.places.take(placeKeys.wsUser(who.tenant, who.user), perUser);
      if (!mine.ok) throw connectionLimit('user', perUser, mine.held);
      const total = await ctx.places.take(placeKeys.wsAll(), all).catch((error: unknown) => {
        mine.release();
        throw error;
      });
      if (!total.ok) {
        mine.release();
        throw connectionLimit('server', all, total.held);
      }
      // Whatever happens next (the upgrade, a client gone before it), the places go with the socket.
      const release = () => {
        mine.release();
        total.release();
      };
      if (request.raw.socket.destroyed) release();
      else request.raw.socket.once('close', release);
    },
    // A plain GET (no upgrade) is told what this route wants, in the API's error body.
    handler: async () => {
      throw new HttpError(
        426,
        'upgrade_required',
        'This route speaks WebSocket: send an Upgrade: websocket request',
        {},
        { upgrade: 'websocket' },
      );
    },
  });
}

function openSession(ctx: RouteContext, sessions: Set<WsSession>, log: Log) {
  return (socket: WebSocket, request: FastifyRequest) => {
    // The upgrade was authenticated, so the header (or the query token copied into it) holds one.
    const secret = bearerOf(request.headers.authorization) ?? '';
    const session = new WsSession(socket, ctx, request.principal, secret, log);
    sessions.add(session);
    let answered = true;
    socket.on('pong', () => (answered = true));
    const ping = setInterval(() => {
      if (!answered) return socket.terminate();
      answered = false;
      socket.ping();
    }, PING_EVERY_MS);
    ping.unref();
    socket.once('close', () => {
      clearInterval(ping);
      void session.settled().finally(() => sessions.delete(session));
    });
  };
}
