/**
 * Three small parts of a PostgreSQL limiter object, each with one job: the work it has in
 * flight (so `close()` can wait for all of it), the listeners of its capacity events, and the
 * one timer that runs a pass when a waiting request will fit a refilled budget or a pause ends.
 */
import type { Clock, ClockTimer, ConcurrencyEvent, ConcurrencyEventListener } from 'sluice/concurrency';
import type { ReleaseOutcome } from './pass-capacity.js';

/** Database work under way (passes, claims, polls, give-backs). */
export class InFlight {
  readonly #work = new Set<Promise<unknown>>();

  /** Keeps `work` where {@link settled} can wait for it. */
  track<T>(work: Promise<T>): Promise<T> {
    this.#work.add(work);
    const untrack = () => void this.#work.delete(work);
    work.then(untrack, untrack);
    return work;
  }

  /** Resolves when the work in flight, and whatever it starts in turn (a give-back), has ended. */
  async settled(): Promise<void> {
    while (this.#work.size > 0) await Promise.allSettled([...this.#work]);
  }
}

/** The listeners of `provider-throttled` and `limit-changed` for releases made through one object. */
export class CapacityListeners {
  readonly #listeners = new Set<ConcurrencyEventListener>();

  constructor(
    private readonly limiter: string,
    private readonly clock: Clock,
  ) {}

  subscribe(listener: ConcurrencyEventListener): () => void {
    this.#listeners.add(listener);
    return () => {
      this.#listeners.delete(listener);
    };
  }

  announce(outcome: ReleaseOutcome, workload: string): void {
    const base = { limiter: this.limiter, workload, at: this.clock.now() };
    const events: ConcurrencyEvent[] = [];
    if (outcome.throttled) events.push({ ...base, type: 'provider-throttled', ...outcome.throttled });
    if (outcome.limitChanged) events.push({ ...base, type: 'limit-changed', ...outcome.limitChanged });
    for (const event of events) {
      for (const listener of this.#listeners) {
        try {
          listener(event);
        } catch {
          // A listener cannot break the limiter.
        }
      }
    }
  }
}

/**
 * One timer per limiter object, for the earliest moment a request waiting here or elsewhere
 * fits a refilled budget, or the pause ends. Any process that learns the time arms it, so a
 * head that waits for a budget is served at the refill even when its own process has not
 * run a pass since.
 */
export class WakeTimer {
  #timer: ClockTimer | undefined;
  #at = Infinity;

  constructor(
    private readonly clock: Clock,
    private readonly wake: () => void,
  ) {}

  /** Fires `wake` at `at` (Infinity: never), unless an earlier wake is already set. */
  arm(at: number): void {
    if (at === Infinity) {
      this.clear();
      return;
    }
    if (this.#timer !== undefined && this.#at <= at) return;
    this.clear();
    this.#at = at;
    this.#timer = this.clock.setTimeout(
      () => {
        this.#timer = undefined;
        this.#at = Infinity;
        this.wake();
      },
      Math.max(0, at - this.clock.now()),
    );
  }

  clear(): void {
    if (this.#timer !== undefined) this.clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#at = Infinity;
  }
}
