import type { FastifyRequest } from 'fastify';
import type { WebSocket } from 'ws';
import { placeKeys } from '../cache/places.js';
import { HttpError } from '../http/errors.js';
import { tuning } from '../tuning.js';
import type { RouteContext } from './context.js';

/** What the WebSocket routes share: the connection caps, the keep-alive pings, the 426. */

/** An open socket's session (a `/ws` one or a live one): closing waits for its runs. */
export interface SocketSession {
  settled(): Promise<void>;
}

/** Seconds a client refused a connection should wait before it tries again. */
const CONNECTION_RETRY_AFTER_S = 30;
const PING_EVERY_MS = tuning.wsPingEveryMs;

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

/** A plain GET (no upgrade) of a WebSocket route is told what the route wants, in the API's error body. */
export async function upgradeRequired(): Promise<never> {
  throw new HttpError(
    426,
    'upgrade_required',
    'This route speaks WebSocket: send an Upgrade: websocket request',
    {},
    { upgrade: 'websocket' },
  );
}

/**
 * Takes the upgrading socket's places under both connection caps (the user's and the server's),
 * or refuses with 429; the places go with the socket, whatever happens to it next.
 */
export async function takeConnectionPlaces(ctx: RouteContext, request: FastifyRequest): Promise<void> {
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
  const release = () => {
    mine.release();
    total.release();
  };
  if (request.raw.socket.destroyed) release();
  else request.raw.socket.once('close', release);
}

/** Pings the client every so often; one that has not answered the last ping is cut off. */
export function keepAlive(socket: WebSocket): void {
  let answered = true;
  socket.on('pong', () => (answered = true));
  const ping = setInterval(() => {
    if (!answered) return socket.terminate();
    answered = false;
    socket.ping();
  }, PING_EVERY_MS);
  ping.unref();
  socket.once('close', () => clearInterval(ping));
}
