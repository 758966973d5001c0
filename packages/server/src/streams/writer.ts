import type { Database } from '@sluice/postgres/database';
import { compact, type StoredEvent } from './codec.js';
import type { RunStreamEvent } from './names.js';
import { insertEvents, type EventRow } from './queries.js';

export interface WriterOptions {
  /** How long an event may wait for the next flush: deltas of that span go in one row. */
  flushMs: number;
  /** Events gathered that start a flush at once. */
  flushEvents: number;
  /** Events kept while the database is away; past it the oldest are dropped (their readers see a gap). */
  maxPending: number;
  log: (message: string, fields?: object) => void;
  /** false: events are dropped as they come (nothing to resume); a benchmark's baseline. */
  store: boolean;
}

/**
 * Gathers the events of every run this process executes and writes them in batches: a row per
 * run and flush, one INSERT per flush (queries.ts insertEvents). `append` only adds to memory,
 * so a streamed delta reaches its client with no database round trip before it; the store
 * catches up within `flushMs`. Flushes run one at a time, and what arrives during one goes in
 * the next. A failed flush keeps its rows and is tried again at the next.
 */
export class EventWriter {
  readonly #db: Database;
  readonly #options: WriterOptions;
  /** Rows not written yet, oldest first; the last row of a run is extended while its ids follow on. */
  #rows: EventRow[] = [];
  readonly #open = new Map<string, EventRow>();
  #pending = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #chain: Promise<void> = Promise.resolve();
  /** The runs whose rows the write under way holds, if one is. */
  #writing: ReadonlySet<string> | undefined;
  #failures = 0;
  readonly #written = new Set<(runIds: readonly string[]) => void>();

  constructor(db: Database, options: WriterOptions) {
    this.#db = db;
    this.#options = options;
  }

  /** Adds event `id` of a run; it is written at the next flush. */
  append(runId: string, id: number, event: RunStreamEvent, data: Record<string, unknown>): void {
    if (!this.#options.store) return;
    const stored: StoredEvent = compact(event, data);
    const open = this.#open.get(runId);
    if (open && open.seq + open.events.length === id) open.events.push(stored);
    else {
      const row = { run_id: runId, seq: id, events: [stored] };
      this.#rows.push(row);
      this.#open.set(runId, row);
    }
    this.#pending++;
    if (this.#pending > this.#options.maxPending) this.#dropOldest();
    if (this.#pending >= this.#options.flushEvents) void this.flush().catch(() => undefined);
    else this.#timer ??= setTimeout(() => void this.flush().catch(() => undefined), this.#delay());
  }

  /** Hears the runs each successful flush wrote (readers in this process look at once). */
  onWritten(listener: (runIds: readonly string[]) => void): () => void {
    this.#written.add(listener);
    return () => this.#written.delete(listener);
  }

  /** Writes everything appended so far; rejects when that write fails (the rows stay for the next). */
  flush(): Promise<void> {
    const next = this.#chain.then(() => this.#write());
    this.#chain = next.catch(() => undefined);
    return next;
  }

  /**
   * Takes the run's events not written yet out of the batch, for a caller that writes them in
   * its own statement (the run's end: runs/lifecycle.ts finishRun). While a write under way
   * holds rows of this run, waits for it first, so every earlier event of the run is either
   * written or back among the pending; a write of other runs' rows only is not waited for.
   */
  async take(runId: string): Promise<EventRow[]> {
    while (this.#writing?.has(runId)) await this.#chain;
    const taken = this.#rows.filter((row) => row.run_id === runId);
    if (taken.length === 0) return [];
    this.#rows = this.#rows.filter((row) => row.run_id !== runId);
    this.#open.delete(runId);
    for (const row of taken) this.#pending -= row.events.length;
    return taken;
  }

  /** Tells the listeners that another statement wrote events of the run (its end: finishRun). */
  stored(runId: string): void {
    for (const listener of this.#written) listener([runId]);
  }

  /** Puts back rows taken that their statement did not write: the next flush writes them. */
  restore(rows: EventRow[]): void {
    if (rows.length === 0) return;
    this.#rows = [...rows, ...this.#rows];
    for (const row of rows) this.#pending += row.events.length;
    this.#timer ??= setTimeout(() => void this.flush().catch(() => undefined), this.#delay());
  }

  /**
   * Writes what is gathered soon, after the I/O of this turn of the event loop (a response's
   * last bytes) has gone out: the end of a run is not held up by its last event's write.
   */
  flushSoon(): void {
    // While writes fail, the backoff's timer stands.
    if (this.#rows.length === 0 || this.#failures > 0) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => void this.flush().catch(() => undefined), 0);
  }

  /** Writes what is left (one attempt) and stops the timer. */
  async close(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.flush().catch((error: unknown) =>
      this.#options.log('run events not written at close', { error: String(error), events: this.#pending }),
    );
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  async #write(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const rows = this.#rows;
    if (rows.length === 0) return;
    this.#rows = [];
    this.#open.clear();
    const count = this.#pending;
    this.#pending = 0;
    const runIds = new Set(rows.map((r) => r.run_id));
    this.#writing = runIds;
    try {
      await insertEvents(this.#db, rows);
      this.#failures = 0;
    } catch (error) {
      // Put back in front of what came meanwhile; the next append (or this retry) writes them.
      if (this.#failures++ === 0) this.#options.log('writing run events failed', { error: String(error) });
      // A row put back may have been written (its answer lost): it is never extended, and the
      // events that follow go in rows of their own (those begun during the write).
      this.#rows = [...rows, ...this.#rows];
      this.#pending += count;
      this.#timer ??= setTimeout(() => void this.flush().catch(() => undefined), this.#delay());
      throw error;
    } finally {
      this.#writing = undefined;
    }
    const written = [...runIds];
    for (const listener of this.#written) listener(written);
  }

  /** The next flush's wait: `flushMs`, backing off to 5 s while writes fail. */
  #delay(): number {
    return Math.min(this.#options.flushMs * 2 ** this.#failures, 5_000);
  }

  #dropOldest(): void {
    const row = this.#rows[0];
    if (!row) return;
    row.events.shift();
    row.seq++;
    this.#pending--;
    if (row.events.length === 0) {
      this.#rows.shift();
      if (this.#open.get(row.run_id) === row) this.#open.delete(row.run_id);
    }
    if (this.#failures > 0 && this.#pending === this.#options.maxPending) {
      this.#options.log('run events dropped: the database has been away too long', {
        kept: this.#options.maxPending,
      });
    }
  }
}
