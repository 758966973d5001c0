import type { Clock, ClockTimer } from 'sluice/concurrency';

/**
 * When the one batched poll of a limiter object runs: at the routine interval (fast without
 * a working LISTEN session or while the database fails, slow otherwise), or when the next
 * known lease lapses if that is sooner, and never two at once.
 */
export class PollSchedule {
  #timer: ClockTimer | undefined;
  #at = Infinity;
  #polling = false;

  constructor(
    private readonly clock: Clock,
    private readonly poll: () => Promise<void>,
    private readonly next: () => { intervalMs: number; nextExpiryAt: number; due: boolean },
  ) {}

  /** Arms the poll for the sooner of the interval and the next expiry, unless one comes sooner still. */
  arm(): void {
    const { intervalMs, nextExpiryAt, due } = this.next();
    if (!due) return;
    const now = this.clock.now();
    // No margin after an expiry: a poll that comes a moment early finds the lease still held
    // and learns the exact time left from the database, then looks again.
    const at = Math.min(now + intervalMs, nextExpiryAt);
    if (this.#timer !== undefined && this.#at <= at) return;
    this.cancel();
    this.#at = at;
    this.#timer = this.clock.setTimeout(() => {
      this.#timer = undefined;
      this.#at = Infinity;
      void this.now();
    }, at - now);
  }

  /** Polls at once (unless a poll is under way), then arms the next one. */
  async now(): Promise<void> {
    if (this.#polling) return;
    this.#polling = true;
    try {
      await this.poll();
    } finally {
      this.#polling = false;
      this.arm();
    }
  }

  cancel(): void {
    if (this.#timer !== undefined) this.clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#at = Infinity;
  }
}
