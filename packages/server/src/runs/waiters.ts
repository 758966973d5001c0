import type { Database } from '@sluice/postgres/database';
import type { RunEvents } from './events.js';
import { isSettled } from './states.js';
import { endedAmong } from './store.js';
import { watchRun } from './watching.js';

const THREAD = 'thread:';
const threadKey = (threadId: string) => `${THREAD}${threadId}`;

export type WaitResult = 'ended' | 'timeout' | 'aborted' | 'closed';

interface Waiter {
  resolve(result: WaitResult): void;
}

/**
 * Callers waiting for runs to end, for the whole process. Nobody polls for their own run: a
 * run ending here wakes its waiters directly, one ending elsewhere through NOTIFY, and one
 * shared query looks at every waited run now and then in case a notification was missed (the
 * only query, whatever the number of waiters). A waiter leaves when its client disconnects.
 *
 * Only the ends of watched runs are announced (sql/035_watched_runs.sql): the first waiter of a
 * run on this process marks it (runs/watching.ts), and is woken at once when the mark finds
 * the run settled already. A mark that failed is tried again by the run's next waiter here.
 */
export class RunWaiters {
  readonly #db: Database;
  readonly #events: RunEvents;
  readonly #waiting = new Map<string, Set<Waiter>>();
  /** Runs waited on here whose mark is under way, and those whose mark failed. */
  readonly #marking = new Set<string>();
  readonly #unmarked = new Set<string>();
  readonly #pollMs: number;
  #poll: ReturnType<typeof setTimeout> | undefined;
  #polling = false;
  #closed = false;

  constructor(db: Database, events: RunEvents, options: { pollMs?: number } = {}) {
    this.#db = db;
    this.#events = events;
    this.#pollMs = options.pollMs ?? 1_000;
    events.on((event) => {
      if (event.kind === 'end') this.ended(event.id);
      if (event.kind === 'thread') this.threadFreed(event.id);
    });
  }

  /** How many callers wait now. */
  get size(): number {
    let n = 0;
    for (const set of this.#waiting.values()) n += set.size;
    return n;
  }

  /** Resolves when the run ends, the time is up, `signal` aborts or the process drains. */
  wait(id: string, options: { timeoutMs: number; signal?: AbortSignal }): Promise<WaitResult> {
    if (this.#closed) return Promise.resolve('closed');
    if (options.signal?.aborted) return Promise.resolve('aborted');
    return new Promise<WaitResult>((resolve) => {
      const timing: { timer?: ReturnType<typeof setTimeout> } = {};
      const onAbort = () => waiter.resolve('aborted');
      const waiter: Waiter = {
        resolve: (result) => {
          clearTimeout(timing.timer);
          options.signal?.removeEventListener('abort', onAbort);
          const set = this.#waiting.get(id);
          set?.delete(waiter);
          if (set?.size === 0) {
            this.#waiting.delete(id);
            this.#unmarked.delete(id);
          }
          resolve(result);
        },
      };
      timing.timer = setTimeout(() => waiter.resolve('timeout'), options.timeoutMs);
      options.signal?.addEventListener('abort', onAbort, { once: true });
      let set = this.#waiting.get(id);
      const first = !set;
      if (!set) this.#waiting.set(id, (set = new Set()));
      set.add(waiter);
      if ((first || this.#unmarked.has(id)) && !this.#marking.has(id) && !id.startsWith(THREAD))
        void this.#watch(id);
      this.#schedulePoll();
    });
  }

  /** Marks the run watched; wakes its waiters when the mark finds it settled. */
  async #watch(id: string): Promise<void> {
    this.#marking.add(id);
    this.#unmarked.delete(id);
    try {
      const status = await watchRun(this.#db, id);
      if (status !== undefined && isSettled(status)) this.ended(id);
    } catch {
      // The database is away: the shared look finds the end, and the next waiter marks again.
      if (this.#waiting.has(id)) this.#unmarked.add(id);
    } finally {
      this.#marking.delete(id);
    }
  }

  /**
   * Resolves ('ended') when the thread is given back by its holder, or as `wait` does. The
   * shared look does not cover threads: callers wait in short slices and try the thread again.
   */
  waitForThread(threadId: string, options: { timeoutMs: number; signal?: AbortSignal }): Promise<WaitResult> {
    return this.wait(threadKey(threadId), options);
  }

  /** A thread was given back: wake the callers waiting for it. */
  threadFreed(threadId: string): void {
    this.ended(threadKey(threadId));
  }

  /** The run ended: wake its waiters. */
  ended(id: string): void {
    const set = this.#waiting.get(id);
    if (!set) return;
    for (const waiter of [...set]) waiter.resolve('ended');
  }

  /** Drain: every waiter is answered now. */
  closeAll(): void {
    this.#closed = true;
    clearTimeout(this.#poll);
    for (const set of [...this.#waiting.values()]) for (const waiter of [...set]) waiter.resolve('closed');
  }

  #schedulePoll(): void {
    if (this.#poll !== undefined || this.#polling || this.#closed) return;
    // With notifications flowing the look is a rare safety net; without them, it is how runs
    // ending on other processes are seen.
    const delay = this.#events.listening ? this.#pollMs * 5 : this.#pollMs;
    this.#poll = setTimeout(() => void this.#look(), delay);
    this.#poll.unref();
  }

  async #look(): Promise<void> {
    this.#poll = undefined;
    if (this.#waiting.size === 0) return;
    this.#polling = true;
    try {
      const runs = [...this.#waiting.keys()].filter((key) => !key.startsWith(THREAD));
      if (runs.length > 0) for (const id of await endedAmong(this.#db, runs)) this.ended(id);
    } catch {
      // The database is away; the next look tries again.
    } finally {
      this.#polling = false;
    }
    if (this.#waiting.size > 0) this.#schedulePoll();
  }
}
