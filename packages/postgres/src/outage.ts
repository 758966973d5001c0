import type { Clock, ClockTimer } from 'sluice/concurrency';

/**
 * How long the database has gone without answering, on the limiter's clock: an unanswered
 * period starts when an operation is sent while none is outstanding, goes on through
 * failures, and ends at the first success. When it lasts `graceMs`, `onOutage` is called once
 * (with the last failure, or a "did not answer" error when the database only hung) and the
 * watch starts afresh.
 *
 *   answered --operation sent--> unanswered --success--> answered
 *   unanswered --failure--> unanswered (failing)
 *   unanswered --graceMs--> onOutage, answered
 */
export class OutageWatch {
  #since: number | undefined;
  #lastError: { error: unknown } | undefined;
  #timer: ClockTimer | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly graceMs: number,
    private readonly onOutage: (cause: unknown) => void,
  ) {}

  /** The last failure of the current unanswered period, if one failed. */
  get failure(): { error: unknown } | undefined {
    return this.#lastError;
  }

  /** Runs one database operation under the watch. */
  async watch<T>(operation: () => Promise<T>): Promise<T> {
    if (this.#since === undefined) {
      this.#since = this.clock.now();
      this.#timer = this.clock.setTimeout(() => this.#expire(), this.graceMs);
    }
    try {
      const result = await operation();
      this.#reset();
      return result;
    } catch (error) {
      if (this.#since !== undefined) this.#lastError = { error };
      throw error;
    }
  }

  /** Stops the watch (the limiter is closing). */
  stop(): void {
    this.#reset();
  }

  #expire(): void {
    this.#timer = undefined;
    const cause =
      this.#lastError?.error ?? new Error(`the database did not answer within ${this.graceMs} ms`);
    this.#reset();
    this.onOutage(cause);
  }

  #reset(): void {
    if (this.#timer !== undefined) this.clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#since = undefined;
    this.#lastError = undefined;
  }
}
