import type { Database, ListenOptions, ListenSession } from '@sluice/postgres/database';

/**
 * A run ended, a run is asked to stop, a thread was given back (`id` is then the thread's), an
 * API token was revoked (`id` is the token's), a run's stream has new stored events, or a
 * run's callback was queued in the outbox.
 */
export type RunEvent = { kind: 'end' | 'cancel' | 'thread' | 'token' | 'events' | 'callback'; id: string };
const kinds = new Set<string>(['end', 'cancel', 'thread', 'token', 'events', 'callback']);

const channel = 'sluice_runs';

/**
 * One LISTEN session per process on the `sluice_runs` channel: 'end:<id>' when a watched run
 * (one a process waits for or reads: runs/watching.ts) reaches a final state (a trigger sends
 * it, whatever SQL made the move) or pauses, 'cancel:<id>' when a cancel is asked of a running
 * run, 'thread:<id>' when a thread is given back, 'events:<id>' when a flush wrote events of a
 * watched run (src/streams/queries.ts), 'callback:<id>' when the outbox queued a run's
 * callback.
 * A lost session (a restarted database) is opened again with backoff, one attempt at a time;
 * meanwhile the shared polls of the waiters and the executor keep everything correct, only
 * slower.
 */
export class RunEvents {
  readonly #db: Database;
  readonly #handlers = new Set<(event: RunEvent) => void>();
  readonly #log: (message: string, error?: unknown) => void;
  readonly #listenOptions: ListenOptions | undefined;
  #session: ListenSession | undefined;
  #retry: ReturnType<typeof setTimeout> | undefined;
  #delayMs = 500;
  #stopped = false;
  #generation = 0;
  /** Numbers the attempts to open a session: a loss is heard from the newest attempt only. */
  #attempt = 0;

  constructor(
    db: Database,
    log: (message: string, error?: unknown) => void = () => undefined,
    listenOptions?: ListenOptions,
  ) {
    this.#db = db;
    this.#log = log;
    this.#listenOptions = listenOptions;
  }

  /** True while NOTIFY arrives; polls may then be rarer. */
  get listening(): boolean {
    return this.#session !== undefined;
  }

  /**
   * Counts the sessions opened: what was learnt under an earlier one may have missed a
   * notification sent while no session listened.
   */
  get generation(): number {
    return this.#generation;
  }

  on(handler: (event: RunEvent) => void): () => void {
    this.#handlers.add(handler);
    return () => this.#handlers.delete(handler);
  }

  async start(): Promise<void> {
    if (!this.#db.listen || this.#stopped) return;
    const attempt = ++this.#attempt;
    try {
      const session = await this.#db.listen(
        channel,
        (payload) => this.#dispatch(payload),
        (error) => this.#lost(attempt, error),
        this.#listenOptions,
      );
      if (this.#stopped || attempt !== this.#attempt) {
        await session.close().catch(() => undefined);
        return;
      }
      this.#session = session;
      this.#generation++;
      this.#delayMs = 500;
    } catch (error) {
      this.#lost(attempt, error);
    }
  }

  #dispatch(payload: string): void {
    const at = payload.indexOf(':');
    const kind = payload.slice(0, at);
    if (!kinds.has(kind)) return;
    const event = { kind, id: payload.slice(at + 1) } as RunEvent;
    for (const handler of this.#handlers) handler(event);
  }

  /**
   * One retry per lost attempt, however many ways it reports the loss: a retry that scheduled
   * another for each report doubled the sessions on every failed attempt, and a database
   * restart then ended in hundreds of connections ("too many clients") from one process.
   */
  #lost(attempt: number, error: unknown): void {
    if (attempt !== this.#attempt || this.#retry !== undefined) return;
    this.#session = undefined;
    if (this.#stopped) return;
    this.#log('run notifications lost; polling until they are back', error);
    this.#retry = setTimeout(() => {
      this.#retry = undefined;
      void this.start();
    }, this.#delayMs);
    this.#retry.unref();
    this.#delayMs = Math.min(this.#delayMs * 2, 10_000);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#retry);
    this.#retry = undefined;
    const session = this.#session;
    this.#session = undefined;
    await session?.close().catch(() => undefined);
  }
}
