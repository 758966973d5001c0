import { AbortWatch } from '../concurrency/abort-watch.js';
import type { Clock } from '../concurrency/clock.js';

/**
 * A controller that aborts with the reason of the first source signal to abort, and can be
 * aborted by hand (a timeout, say). `dispose()` takes its listeners off the sources: a run
 * leaves nothing attached to its caller's signal when it ends. (`AbortSignal.any` would keep
 * the sources referenced with no way to let go.)
 */
export class LinkedAbort {
  /**
   * Every LinkedAbort's sources, one listener per source signal: a run's signal linked into
   * each of its parallel tool calls and child agents carries one listener, not one each.
   */
  static readonly #sources = new AbortWatch<LinkedAbort>((linked, reason) => linked.abort(reason));
  readonly #controller = new AbortController();
  #linked: AbortSignal[] = [];

  constructor(sources: readonly (AbortSignal | undefined)[]) {
    for (const source of sources) {
      if (!source) continue;
      if (source.aborted) {
        this.abort(source.reason);
        break;
      }
      LinkedAbort.#sources.watch(source, this);
      this.#linked.push(source);
    }
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  abort(reason: unknown): void {
    if (this.#controller.signal.aborted) return;
    this.#controller.abort(reason);
    this.dispose();
  }

  dispose(): void {
    for (const source of this.#linked) LinkedAbort.#sources.unwatch(source, this);
    this.#linked = [];
  }
}

/** Runs `onTimeout` after `ms` on `clock`; `clear()` cancels it. No timer at all for `undefined`. */
export function timer(clock: Clock, ms: number | undefined, onTimeout: () => void): { clear(): void } {
  if (ms === undefined) return { clear: () => undefined };
  let pending = true;
  const handle = clock.setTimeout(() => {
    pending = false;
    onTimeout();
  }, ms);
  return {
    clear() {
      if (pending) clock.clearTimeout(handle);
      pending = false;
    },
  };
}

/** Waits `ms` on `clock`; rejects with the signal's reason if it aborts first. */
export function sleep(clock: Clock, ms: number, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      wait.clear();
      reject(signal.reason);
    };
    const wait = timer(clock, ms, () => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    });
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
