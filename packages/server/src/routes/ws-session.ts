import type { WebSocket } from 'ws';
import { agentFor } from '../config.js';
import { requireRole } from '../http/auth.js';
import {
  HttpError,
  badRequest,
  draining,
  isStoreUnavailable,
  notFound,
  refusalOf,
  shown,
} from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { CANCEL_CONFIRM_MS, cancelRun, mayCancel } from '../runs/cancel.js';
import { getRun } from '../runs/store.js';
import { submitHeld } from '../runs/submission.js';
import type { Principal } from '../store/tokens.js';
import type { RouteContext } from './context.js';
import { playRun } from './stream-run.js';
import { parseFrame, requestIdOf, type CancelFrame, type RunFrame } from './ws-frames.js';

/** Runs (and, apart, cancels) one socket may have in flight at once; each run also counts for the user's held-run cap. */
const MAX_RUNS_PER_SOCKET = 100;

export type Log = (level: 'warn' | 'error', message: string, fields?: object) => void;

/** An error of a frame as the HTTP error its error frame carries (an unexpected one is logged, and a 500). */
export function frameError(error: unknown, log: Log): HttpError {
  const refused = refusalOf(error);
  if (refused) return refused;
  if (isStoreUnavailable(error))
    return new HttpError(503, 'store_unavailable', 'The server cannot reach its database; try again shortly');
  log('error', 'websocket frame failed', { error: (error as Error)?.stack ?? String(error) });
  return new HttpError(500, 'internal_error', 'internal error');
}

/** A frame's text, or null for a binary frame. */
export function frameText(data: unknown, isBinary: boolean): string | null {
  if (isBinary) return null;
  if (Buffer.isBuffer(data)) return data.toString('utf8');
  if (Array.isArray(data)) return Buffer.concat(data as Buffer[]).toString('utf8');
  return Buffer.from(data as ArrayBuffer).toString('utf8');
}

/**
 * False, after a 401 error (told to `refuse`) and a close with 1008, once the socket's token
 * has been revoked since the upgrade: the socket must not outlive what let it in.
 */
export async function tokenLive(
  ctx: Pick<RouteContext, 'principals'>,
  secret: string,
  socket: WebSocket,
  refuse: (error: HttpError) => void,
): Promise<boolean> {
  if (await ctx.principals.find(secret)) return true;
  refuse(new HttpError(401, 'authentication_required', 'The API token of this socket was revoked'));
  socket.close(1008, 'token revoked');
  return false;
}

/**
 * One open WebSocket of one token: its run and cancel frames, the events of its runs as frames,
 * and refusals as `error` frames on a socket that stays open. Each run is a held run, admitted
 * as the HTTP stream's (the user's place, the thread, admission), so it counts where they count.
 */
export class WsSession {
  readonly #socket: WebSocket;
  readonly #ctx: RouteContext;
  readonly #who: Principal;
  /** The socket's token, looked up again for every frame: a revocation stops an open socket too. */
  readonly #secret: string;
  readonly #log: Log;
  /** Aborts when the socket closes: waits for a thread end, `on_disconnect: 'cancel'` runs stop. */
  readonly #gone = new AbortController();
  /** The request ids in flight, and the work of each until its last frame is sent. */
  readonly #inFlight = new Map<string, Promise<void>>();
  /** Cancel frames still being answered. */
  #cancels = 0;

  constructor(socket: WebSocket, ctx: RouteContext, who: Principal, secret: string, log: Log) {
    this.#socket = socket;
    this.#ctx = ctx;
    this.#who = who;
    this.#secret = secret;
    this.#log = log;
    socket.on('message', (data, isBinary) => this.#onFrame(data, isBinary));
    socket.once('close', () => this.#gone.abort());
  }

  /** Resolves once every run of this socket has sent its last frame. */
  async settled(): Promise<void> {
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight.values()]);
  }

  #send(frame: object): void {
    if (this.#socket.readyState === this.#socket.OPEN) this.#socket.send(JSON.stringify(frame));
  }

  #refuse(requestId: string | null, error: unknown): void {
    this.#send({ type: 'error', request_id: requestId, error: this.#asHttpError(error).body().error });
  }

  #tokenLive(requestId: string | null): Promise<boolean> {
    return tokenLive(this.#ctx, this.#secret, this.#socket, (error) => this.#refuse(requestId, error));
  }

  #tooMany(what: 'runs' | 'cancels', active: number): HttpError {
    return new HttpError(
      429,
      'too_many_requests',
      `This socket has ${active} ${what} in flight; the limit is ${MAX_RUNS_PER_SOCKET}`,
      { limit: `${what}_per_socket`, limit_value: MAX_RUNS_PER_SOCKET },
    );
  }

  #asHttpError(error: unknown): HttpError {
    return frameError(error, this.#log);
  }

  #onFrame(data: unknown, isBinary: boolean): void {
    const text = frameText(data, isBinary);
    if (text === null) return this.#refuse(null, badRequest('Send frames as text (JSON), not binary'));
    const parsed = parseFrame(text);
    if ('error' in parsed) return this.#refuse(requestIdOf(parsed.frame), parsed.error);
    const frame = parsed.frame;
    if (frame.type === 'cancel') {
      // Cancels wait on the database and on the run: bounded like runs, or a flood of them is not.
      if (this.#cancels >= MAX_RUNS_PER_SOCKET)
        return this.#refuse(frame.request_id ?? null, this.#tooMany('cancels', this.#cancels));
      this.#cancels += 1;
      void this.#cancel(frame)
        .catch((error: unknown) => this.#refuse(frame.request_id ?? null, error))
        .finally(() => (this.#cancels -= 1));
      return;
    }
    if (this.#inFlight.has(frame.request_id)) {
      return this.#refuse(
        frame.request_id,
        badRequest(
          `Request \`${shown(frame.request_id)}\` is still in flight on this socket; use a new request_id`,
          {
            field: 'request_id',
          },
        ),
      );
    }
    if (this.#inFlight.size >= MAX_RUNS_PER_SOCKET)
      return this.#refuse(frame.request_id, this.#tooMany('runs', this.#inFlight.size));
    const work = this.#run(frame)
      .catch((error: unknown) => this.#refuse(frame.request_id, error))
      .finally(() => this.#inFlight.delete(frame.request_id));
    this.#inFlight.set(frame.request_id, work);
  }

  async #run(frame: RunFrame): Promise<void> {
    if (!(await this.#tokenLive(frame.request_id))) return;
    const ctx = this.#ctx;
    const who = this.#who;
    requireRole(who, 'member', 'create runs');
    if (ctx.isDraining()) throw draining();
    if (!agentFor(ctx.config, who.tenant, frame.agent)) throw notFound(`No agent \`${shown(frame.agent)}\``);
    if (frame.input !== undefined && frame.messages !== undefined)
      throw badRequest('Give `input` or `messages`, not both', { field: 'messages' });
    const input = frame.messages ?? frame.input;
    if (input === undefined)
      throw badRequest('Expected `input` (a string or messages) or `messages`', { field: 'input' });
    const field = frame.messages ? 'messages' : 'input';
    checkInput(input, field);
    const requestId = frame.request_id;
    const { done } = await submitHeld(
      ctx,
      who,
      {
        agent: frame.agent,
        inputField: field,
        class: 'default',
        input,
        threadId: frame.thread_id,
        config: frame.config,
        onBusy: frame.on_busy,
      },
      {
        signal: this.#gone.signal,
        // As on HTTP streams: a socket that closes leaves its runs going, unless the frame said otherwise.
        onDisconnect: frame.on_disconnect,
        play: (run) =>
          playRun(ctx.executor, run, ctx.db, (event, data) =>
            this.#send({ type: event, request_id: requestId, data }),
          ),
      },
    );
    await done;
  }

  async #cancel(frame: CancelFrame): Promise<void> {
    if (!(await this.#tokenLive(frame.request_id ?? null))) return;
    const ctx = this.#ctx;
    const who = this.#who;
    requireRole(who, 'member', 'cancel runs');
    const run = await getRun(ctx.db, who.tenant, frame.run_id);
    if (!run) throw notFound(`No run \`${shown(frame.run_id)}\``);
    if (!mayCancel(who, run))
      throw new HttpError(
        403,
        'permission_denied',
        `Run ${run.id} belongs to another project; an admin token can cancel it`,
      );
    // The run's own frames say how it ended (run.canceled), on the socket that started it.
    await cancelRun(ctx, run, { confirmMs: CANCEL_CONFIRM_MS, signal: this.#gone.signal });
  }
}
