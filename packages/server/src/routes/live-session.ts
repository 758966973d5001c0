import type { WebSocket } from 'ws';
import { requireRole } from '../http/auth.js';
import { HttpError, badRequest, draining } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { submitHeld } from '../runs/submission.js';
import { toApiRun } from '../runs/store.js';
import type { Principal } from '../store/tokens.js';
import type { RouteContext } from './context.js';
import { LIVE_MAX_FRAME_BYTES, parseInputFrame, type InputFrame } from './live-frames.js';
import { playRun } from './stream-run.js';
import { frameError, frameText, tokenLive, type Log } from './ws-session.js';

/** The agent and thread a live session was opened for. */
export interface LiveBinding {
  agent: string;
  threadId: string;
}

/** A turn of the session: its run once admitted, and what stops it. */
interface Turn {
  readonly stop: AbortController;
  runId?: string;
  done?: Promise<void>;
}

const turnInProgress = (runId: string | undefined) =>
  new HttpError(
    409,
    'turn_in_progress',
    `A turn of this session is still running${runId ? ` (run ${runId})` : ''}; wait for its turn.completed or turn.failed, or send the input with "on_busy": "cancel"`,
    { field: 'on_busy' },
  );

const replaced = () =>
  new HttpError(
    409,
    'turn_canceled',
    'A later input with "on_busy": "cancel" replaced this one before it ran',
  );

/**
 * One open live socket, bound to one agent and one thread: each input frame is a turn of the
 * thread, a held run submitted like any other (the user's place, the thread lock, the caps,
 * the per-turn bounds), whose text comes back as `message.delta` frames and ends in one
 * `turn.completed` or `turn.failed`. One turn at a time. The session has no time limit of its
 * own: its turns do (runs.timeoutMs), the socket lives on between them.
 */
export class LiveSession {
  readonly #socket: WebSocket;
  readonly #ctx: RouteContext;
  readonly #who: Principal;
  readonly #secret: string;
  readonly #binding: LiveBinding;
  readonly #log: Log;
  /** Aborts when the socket closes: the turn in progress is canceled, its thread freed. */
  readonly #gone = new AbortController();
  #turn: Turn | undefined;

  constructor(
    socket: WebSocket,
    ctx: RouteContext,
    who: Principal,
    secret: string,
    binding: LiveBinding,
    log: Log,
  ) {
    this.#socket = socket;
    this.#ctx = ctx;
    this.#who = who;
    this.#secret = secret;
    this.#binding = binding;
    this.#log = log;
    socket.on('message', (data, isBinary) => this.#onFrame(data, isBinary));
    socket.once('close', () => this.#gone.abort());
  }

  /** Resolves once the turn in progress (and any waiting behind it) has sent its last frame. */
  async settled(): Promise<void> {
    while (this.#turn?.done) await this.#turn.done.catch(() => undefined);
  }

  #send(frame: object): void {
    if (this.#socket.readyState === this.#socket.OPEN) this.#socket.send(JSON.stringify(frame));
  }

  #refuse(error: unknown): void {
    this.#send({ type: 'error', error: frameError(error, this.#log).body().error });
  }

  #failed(runId: string | null, error: unknown): void {
    this.#send({ type: 'turn.failed', data: { run_id: runId, error } });
  }

  #onFrame(data: unknown, isBinary: boolean): void {
    const bytes = Buffer.isBuffer(data) ? data.length : Array.isArray(data) ? Buffer.concat(data).length : 0;
    if (bytes > LIVE_MAX_FRAME_BYTES) {
      this.#socket.close(1009, `frame over ${LIVE_MAX_FRAME_BYTES} bytes`);
      return;
    }
    const text = frameText(data, isBinary);
    if (text === null) return this.#refuse(badRequest('Send frames as text (JSON), not binary'));
    const parsed = parseInputFrame(text);
    if ('error' in parsed) return this.#refuse(parsed.error);
    this.#start(parsed.frame);
  }

  /** Starts a turn, or refuses it while one runs (unless it replaces that one). */
  #start(frame: InputFrame): void {
    const current = this.#turn;
    if (current && frame.on_busy !== 'cancel') return this.#refuse(turnInProgress(current.runId));
    current?.stop.abort();
    const turn: Turn = { stop: new AbortController() };
    const before = current?.done ?? Promise.resolve();
    turn.done = before
      .then(() => this.#play(frame.text, turn))
      .catch((error: unknown) => this.#failed(turn.runId ?? null, frameError(error, this.#log).body().error))
      .finally(() => {
        if (this.#turn === turn) this.#turn = undefined;
      });
    this.#turn = turn;
  }

  async #play(text: string, turn: Turn): Promise<void> {
    if (turn.stop.signal.aborted) throw replaced();
    if (!(await tokenLive(this.#ctx, this.#secret, this.#socket, (e) => this.#refuse(e)))) return;
    const ctx = this.#ctx;
    requireRole(this.#who, 'member', 'create runs');
    if (ctx.isDraining()) throw draining();
    checkInput(text, 'text');
    let deltas = '';
    const { done } = await submitHeld(
      ctx,
      this.#who,
      {
        agent: this.#binding.agent,
        inputField: 'text',
        class: 'default',
        input: text,
        threadId: this.#binding.threadId,
      },
      {
        // The socket closing, or a later input replacing this turn, cancels the run.
        signal: AbortSignal.any([this.#gone.signal, turn.stop.signal]),
        onDisconnect: 'cancel',
        play: async (run) => {
          turn.runId = run.id;
          const final = await playRun(ctx.executor, run, ctx.db, (event, data) => {
            if (event === 'message.delta') {
              const delta = (data as { text: string }).text;
              deltas += delta;
              this.#send({ type: 'message.delta', data: { run_id: run.id, text: delta } });
            }
          });
          this.#ended(toApiRun(final), deltas);
        },
      },
    );
    await done;
  }

  /** The turn's one final frame, from the run as it ended. */
  #ended(run: ReturnType<typeof toApiRun>, deltas: string): void {
    if (run.status === 'succeeded') {
      const output = run.output as { text?: unknown } | string | null;
      const text =
        typeof output === 'string' ? output : typeof output?.text === 'string' ? output.text : deltas;
      this.#send({ type: 'turn.completed', data: { run_id: run.id, text } });
    } else if (run.status === 'requires_action') {
      this.#send({
        type: 'turn.requires_action',
        data: { run_id: run.id, required_action: run.required_action ?? null },
      });
    } else {
      this.#failed(run.id, run.error ?? { type: run.status, message: `The run ended ${run.status}` });
    }
  }
}
