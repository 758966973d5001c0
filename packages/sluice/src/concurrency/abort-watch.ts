/**
 * The waiters of a limiter that wait with an AbortSignal, with one 'abort' listener per signal
 * however many of them share it. A caller that passes one signal to many requests (a run's
 * cancel signal shared by its parallel tool calls or child agents, a batch cancelled as one)
 * would otherwise put a listener on it per waiting request: Node warns past ten
 * (MaxListenersExceededWarning), and each listener costs an entry to add and to take off.
 *
 * On abort, `onAbort` is called for each waiter still watched on that signal, in the order they
 * were watched, as separate listeners would have been.
 */
export class AbortWatch<T> {
  readonly #watched = new Map<AbortSignal, { waiters: Set<T>; listener: () => void }>();

  constructor(private readonly onAbort: (waiter: T, reason: unknown) => void) {}

  /** Calls `onAbort(waiter, signal.reason)` when `signal` aborts, unless unwatched first. */
  watch(signal: AbortSignal, waiter: T): void {
    let entry = this.#watched.get(signal);
    if (entry === undefined) {
      const waiters = new Set<T>();
      const listener = () => {
        // The live set: a waiter unwatched by an earlier one's callback is skipped, as a
        // listener taken off during the dispatch would be.
        for (const each of waiters) this.onAbort(each, signal.reason);
        waiters.clear();
        this.#watched.delete(signal);
      };
      entry = { waiters, listener };
      this.#watched.set(signal, entry);
      signal.addEventListener('abort', listener, { once: true });
    }
    entry.waiters.add(waiter);
  }

  /** Stops watching `waiter`; the signal's listener goes with its last waiter. */
  unwatch(signal: AbortSignal, waiter: T): void {
    const entry = this.#watched.get(signal);
    if (entry === undefined || !entry.waiters.delete(waiter)) return;
    if (entry.waiters.size > 0) return;
    signal.removeEventListener('abort', entry.listener);
    this.#watched.delete(signal);
  }

  /** How many signals have a listener now (for tests). */
  get signals(): number {
    return this.#watched.size;
  }
}
