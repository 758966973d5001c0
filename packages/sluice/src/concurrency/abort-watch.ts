/** More than one waiter on a signal (a lone waiter is kept as itself, with no set). */
class Several<T> extends Set<T> {}

/**
 * Things waiting on AbortSignals, with one 'abort' listener per signal however many of them
 * share it. A caller that passes one signal to many requests (a run's cancel signal shared by
 * its parallel tool calls or child agents, a batch cancelled as one) would otherwise get a
 * listener on it per waiting request: Node warns past ten (MaxListenersExceededWarning), and
 * each listener costs an entry to add and to take off.
 *
 * On abort, `onAbort` is called for each waiter still watched on that signal, in the order this
 * watch was given them; a waiter unwatched by an earlier one's callback is skipped, as a
 * listener taken off during the dispatch would be. Then `afterAbort`, once: a limiter that
 * hands freed places on does it there, after every waiter of the signal has left, so none of
 * them is granted a place during its own cancellation. A callback that throws does not stop
 * the others; its error is thrown again in a microtask (an uncaught exception, as from a
 * listener).
 */
export class AbortWatch<T> {
  readonly #watched = new Map<AbortSignal, T | Several<T>>();

  constructor(
    private readonly onAbort: (waiter: T, reason: unknown) => void,
    private readonly afterAbort?: (signal: AbortSignal) => void,
  ) {}

  /**
   * Calls `onAbort(waiter, signal.reason)` when `signal` aborts, unless unwatched first. A
   * signal that has aborted already will not fire again: the caller handles that case itself.
   */
  watch(signal: AbortSignal, waiter: T): void {
    if (signal.aborted) throw new TypeError('AbortWatch.watch: the signal has already aborted');
    const held = this.#watched.get(signal);
    if (held === undefined) {
      this.#watched.set(signal, waiter);
      signal.addEventListener('abort', this.#listener, { once: true });
    } else if (held instanceof Several) held.add(waiter);
    else if (held !== waiter) this.#watched.set(signal, new Several([held, waiter]));
  }

  /** Stops watching `waiter` on `signal`; the signal's listener goes with its last waiter. */
  unwatch(signal: AbortSignal, waiter: T): void {
    const held = this.#watched.get(signal);
    if (held === undefined) return;
    if (held instanceof Several) {
      if (!held.delete(waiter) || held.size > 0) return;
    } else if (held !== waiter) return;
    this.#watched.delete(signal);
    signal.removeEventListener('abort', this.#listener);
  }

  /** How many signals have a listener now. */
  get signals(): number {
    return this.#watched.size;
  }

  // One function for every signal: the signal is the event's target.
  readonly #listener = (event: Event): void => {
    const signal = event.target as AbortSignal;
    const held = this.#watched.get(signal);
    if (held === undefined) return;
    const errors: unknown[] = [];
    const call = (waiter: T) => {
      try {
        this.onAbort(waiter, signal.reason);
      } catch (error) {
        errors.push(error);
      }
    };
    // The live set: a waiter unwatched meanwhile is not reached.
    if (held instanceof Several) for (const waiter of held) call(waiter);
    else call(held);
    if (this.#watched.get(signal) === held) this.#watched.delete(signal);
    if (held instanceof Several) held.clear();
    try {
      this.afterAbort?.(signal);
    } catch (error) {
      errors.push(error);
    }
    for (const error of errors)
      queueMicrotask(() => {
        throw error;
      });
  };
}
