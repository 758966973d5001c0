/**
 * Time source for the limiter and the slot lifecycle. Everything that decides by time reads
 * `now()` once per decision and schedules through this interface, so tests can drive time
 * by hand with {@link ManualClock} instead of sleeping.
 */
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /**
   * Runs `callback` after `ms`. A `background` timer does not keep the process alive
   * (lease sweeps); other timers (wait deadlines) do.
   */
  setTimeout(callback: () => void, ms: number, options?: { background?: boolean }): ClockTimer;
  clearTimeout(timer: ClockTimer): void;
}

/** Opaque timer handle returned by {@link Clock.setTimeout}. */
export type ClockTimer = { readonly __clockTimer?: never } | object;

export const SECOND = 1000;
export const MINUTE = 60 * SECOND;

/**
 * The longest delay Node's `setTimeout` takes (2^31 - 1 ms, about 24.8 days). Past it Node
 * fires after 1 ms instead: a wait of `timeoutMs: 3e9` would time out at once, and a lease
 * sweep of a long `leaseTtlMs` would run every millisecond.
 */
const MAX_NODE_TIMER_MS = 2 ** 31 - 1;

/** A timer longer than Node allows, run as a chain of shorter ones; `current` is the live one. */
class ChainedTimer {
  current: ReturnType<typeof setTimeout> | undefined;
}

function nodeTimer(callback: () => void, ms: number, background: boolean): ReturnType<typeof setTimeout> {
  const timer = setTimeout(callback, ms);
  if (background) timer.unref();
  return timer;
}

/** The wall clock and Node's timers. */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout(callback, ms, options) {
    const background = options?.background === true;
    let left = Math.max(0, ms);
    if (left <= MAX_NODE_TIMER_MS) return nodeTimer(callback, left, background);
    const chain = new ChainedTimer();
    const step = () => {
      const part = Math.min(left, MAX_NODE_TIMER_MS);
      left -= part;
      chain.current = nodeTimer(left > 0 ? step : callback, part, background);
    };
    step();
    return chain;
  },
  clearTimeout(timer) {
    clearTimeout(timer instanceof ChainedTimer ? timer.current : (timer as ReturnType<typeof setTimeout>));
  },
};

interface ManualTimer {
  at: number;
  order: number;
  callback: () => void;
  cancelled: boolean;
}

/**
 * A clock that only moves when told to. Timers fire in time order (ties in the order they
 * were set) during {@link ManualClock.advance}.
 *
 * @example
 * const clock = new ManualClock();
 * const limiter = createConcurrencyLimiter({ maxConcurrent: 1, leaseTtlMs: 1000, clock });
 * clock.advance(1000); // the lease expires now, not a second from now
 */
export class ManualClock implements Clock {
  #now: number;
  #order = 0;
  #timers: ManualTimer[] = [];

  constructor(start = 1_700_000_000_000) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  setTimeout(callback: () => void, ms: number): ClockTimer {
    const timer: ManualTimer = {
      at: this.#now + Math.max(0, ms),
      order: this.#order++,
      callback,
      cancelled: false,
    };
    this.#timers.push(timer);
    return timer;
  }

  clearTimeout(timer: ClockTimer): void {
    (timer as ManualTimer).cancelled = true;
  }

  /** Timers set and not yet fired or cleared. */
  get pendingTimers(): number {
    return this.#timers.filter((t) => !t.cancelled).length;
  }

  /** Moves time forward by `ms`, firing every timer that falls due on the way. */
  advance(ms: number): void {
    const target = this.#now + ms;
    for (;;) {
      this.#timers = this.#timers.filter((t) => !t.cancelled);
      let next: ManualTimer | undefined;
      for (const t of this.#timers) {
        if (t.at <= target && (!next || t.at < next.at || (t.at === next.at && t.order < next.order)))
          next = t;
      }
      if (!next) break;
      this.#now = Math.max(this.#now, next.at);
      next.cancelled = true;
      next.callback();
    }
    this.#now = target;
  }
}
