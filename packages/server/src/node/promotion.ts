import type { Clock, ClockTimer } from 'sluice/concurrency';

/**
 * When the passes that move due scheduled runs to their queues come: every `busyMs` while any
 * run waits for its time (or after a failed pass), every `idleMs` while none does. A run
 * scheduled on this process (`scheduled()`) brings the next pass forward to `busyMs`; one
 * scheduled during a pass makes the pass after it come at `busyMs` whatever that pass saw (its
 * read may have come before the run was written). A run scheduled on another process is
 * promoted by that process, or by this one `idleMs` late at most when that one died.
 */
export class PromotionPasses {
  readonly #pass: () => Promise<boolean>;
  readonly #clock: Clock;
  readonly #busyMs: number;
  readonly #idleMs: number;
  #timer: ClockTimer | undefined;
  #idle = false;
  #hurry = false;
  #stopped = false;

  /** `pass` moves what is due and says whether any run still waits; it never rejects. */
  constructor(pass: () => Promise<boolean>, clock: Clock, busyMs: number, idleMs: number) {
    this.#pass = pass;
    this.#clock = clock;
    this.#busyMs = busyMs;
    this.#idleMs = idleMs;
  }

  start(): void {
    this.#plan(this.#busyMs);
  }

  /** A run was written to wait for its time, here. */
  scheduled(): void {
    this.#hurry = true;
    if (this.#idle && this.#timer !== undefined) {
      this.#idle = false;
      this.#plan(this.#busyMs);
    }
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #plan(ms: number): void {
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer);
    this.#timer = this.#clock.setTimeout(() => void this.#run(), ms, { background: true });
  }

  async #run(): Promise<void> {
    this.#timer = undefined;
    this.#hurry = false;
    const waiting = await this.#pass();
    if (this.#stopped) return;
    this.#idle = !waiting && !this.#hurry;
    this.#plan(this.#idle ? this.#idleMs : this.#busyMs);
  }
}
