import type { Clock } from 'sluice/concurrency';
import type { RunEvents } from '../runs/events.js';
import type { EventWriter } from './writer.js';

/**
 * Wakes readers of a run's stream when there may be news: this process wrote events of it, a
 * NOTIFY said another process did ('events:<id>'), or the run ended ('end:<id>'). Readers also
 * look on their own every `pollMs`, so a lost notification (a pooler in transaction mode, a
 * restarted database) only makes them slower.
 */
export class EventFeed {
  readonly #waiting = new Map<string, Set<() => void>>();
  readonly #clock: Clock;

  constructor(writer: EventWriter, events: RunEvents, clock: Clock) {
    this.#clock = clock;
    writer.onWritten((runIds) => {
      for (const id of runIds) this.#wake(id);
    });
    events.on((event) => {
      if (event.kind === 'events' || event.kind === 'end') this.#wake(event.id);
    });
  }

  /** Resolves at the run's next news, after `ms`, or when `signal` aborts, whichever comes first. */
  next(runId: string, ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      let set = this.#waiting.get(runId);
      if (!set) this.#waiting.set(runId, (set = new Set()));
      const waiters = set;
      const done = () => {
        this.#clock.clearTimeout(timer);
        signal.removeEventListener('abort', done);
        waiters.delete(done);
        if (waiters.size === 0 && this.#waiting.get(runId) === waiters) this.#waiting.delete(runId);
        resolve();
      };
      const timer = this.#clock.setTimeout(done, ms, { background: true });
      signal.addEventListener('abort', done, { once: true });
      waiters.add(done);
    });
  }

  #wake(runId: string): void {
    const set = this.#waiting.get(runId);
    if (!set) return;
    for (const done of [...set]) done();
  }
}
