import type { Database } from '@sluice/postgres/database';
import type { Clock } from 'sluice/concurrency';
import type { RunEvents } from '../runs/events.js';
import { toApiRun, type RunRow } from '../runs/store.js';
import { tuning } from '../tuning.js';
import type { StreamEvent } from './codec.js';
import { EventFeed } from './feed.js';
import { markWatched } from '../runs/watching.js';
import { followRun } from './follow.js';
import type { LastEvent, RunStreamEvent } from './names.js';
import { pauseEndId, type EventRow } from './queries.js';
import { EventWriter } from './writer.js';

export type { StreamEvent } from './codec.js';
export type { EventRow } from './queries.js';
export { isLastEvent, lastEventOf, type LastEvent, type RunStreamEvent } from './names.js';

/** A run's first event: written at admission, by the process that admitted it. */
export const createdEvent = (run: RunRow): StreamEvent => ({
  id: 1,
  event: 'run.created',
  data: toApiRun(run),
});

/** The ids of one execution of a run, handed out as it records its events. */
export class RunLog {
  #next: number;
  constructor(
    private readonly writer: EventWriter,
    private readonly runId: string,
    next: number,
  ) {
    this.#next = next;
  }

  /** Stores the event (at the next flush) and returns it with its id. */
  record(event: RunStreamEvent, data: Record<string, unknown>): StreamEvent {
    const id = this.#next++;
    this.writer.append(this.runId, id, event, data);
    return { id, event, data };
  }

  /** The id the next event gets: the last one's, for the statement that ends the run. */
  get next(): number {
    return this.#next;
  }

  /** The event the statement that ended the run stored already (`next` was its id). */
  ended(event: LastEvent, data: Record<string, unknown>): StreamEvent {
    const id = this.#next++;
    this.writer.stored(this.runId);
    return { id, event, data };
  }
}

/**
 * The stored streams of this process's runs: the writer that batches their events, and the
 * readers of `GET /agents/runs/:id/events` (any run, executed here or elsewhere).
 */
export class RunStreams {
  readonly #db: Database;
  readonly #events: RunEvents;
  readonly #writer: EventWriter;
  readonly #feed: EventFeed;
  readonly #clock: Clock;
  readonly #storing: boolean;
  /** Marks under way, by run: readers of one run share one (runs/watching.ts). */
  readonly #marks = new Map<string, Promise<void>>();

  constructor(
    db: Database,
    events: RunEvents,
    clock: Clock,
    log: (message: string, fields?: object) => void,
    options: { store: boolean } = { store: true },
  ) {
    this.#db = db;
    this.#events = events;
    this.#clock = clock;
    this.#storing = options.store;
    this.#writer = new EventWriter(db, {
      flushMs: tuning.streamFlushMs,
      flushEvents: tuning.streamFlushEvents,
      maxPending: tuning.streamMaxPendingEvents,
      store: options.store,
      log,
    });
    this.#feed = new EventFeed(this.#writer, events, clock);
  }

  /** Stores `run.created` of an admitted run. */
  created(run: RunRow): StreamEvent {
    const event = createdEvent(run);
    this.#writer.append(run.id, event.id, event.event, event.data);
    return event;
  }

  /**
   * The ids of a run's execution: after `run.created` for a new run; for a resumed run, after
   * the event that ended its pause, stored or still to be (another process may not have
   * written it yet: `pauseEndId`), read once after writing what this process holds.
   */
  async open(run: RunRow): Promise<RunLog> {
    if (!run.resuming) return new RunLog(this.#writer, run.id, 2);
    await this.#writer.flush().catch(() => undefined);
    const pauseEnd = await pauseEndId(this.#db, run.id).catch(() => 1);
    return new RunLog(this.#writer, run.id, Math.max(pauseEnd, 1) + 1);
  }

  /** Whether events are stored (false: a benchmark's baseline, nothing to resume). */
  get storing(): boolean {
    return this.#storing;
  }

  /** Writes what is gathered now; rejects when the write fails. */
  flush(): Promise<void> {
    return this.#writer.flush();
  }

  /**
   * The run's events not written yet, taken out of the next flush for the statement that ends
   * the run (runs/lifecycle.ts finishRun, pauseRun): they are stored with its end, in one round
   * trip. Give back with `restore` what that statement did not write.
   */
  takePending(runId: string): Promise<EventRow[]> {
    return this.#writer.take(runId);
  }

  restore(rows: EventRow[]): void {
    this.#writer.restore(rows);
  }

  /** Writes what is gathered right after this turn's I/O, not waited for (a run's last event). */
  flushSoon(): void {
    this.#writer.flushSoon();
  }

  follow(tenant: string, runId: string, after: number, signal: AbortSignal): AsyncGenerator<StreamEvent> {
    return followRun(
      {
        db: this.#db,
        feed: this.#feed,
        clock: this.#clock,
        pollMs: () => (this.#events.listening ? tuning.streamPollMs : tuning.streamPollUnheardMs),
        firstPollMs: tuning.streamPollUnheardMs,
        markWatched: (id) => this.#markWatched(id),
        graceMs: tuning.streamGraceMs,
      },
      tenant,
      runId,
      after,
      signal,
    );
  }

  #markWatched(runId: string): Promise<void> {
    let mark = this.#marks.get(runId);
    if (!mark) {
      mark = markWatched(this.#db, runId).finally(() => this.#marks.delete(runId));
      this.#marks.set(runId, mark);
    }
    return mark;
  }

  close(): Promise<void> {
    return this.#writer.close();
  }
}
