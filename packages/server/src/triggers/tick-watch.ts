/**
 * When the schedule triggers' ticker has to look again. On a store this process alone writes
 * (embedded PGlite, `Store.solo`) every trigger is made here, so the earliest next tick is
 * known: the ticker reads it after each look and sleeps until then, and a trigger made here
 * brings it forward. On a shared store other processes make triggers: it looks every time.
 *
 * A look reads the earliest tick while a trigger may be made beside it: what that read says is
 * kept only when no trigger was made since it began (`begin` numbers the reads), or the next
 * check looks again.
 */
export class TickWatch {
  readonly #solo: boolean;
  /** The earliest next tick known, epoch ms; undefined: not known, look. */
  #nextMs: number | undefined;
  #made = 0;

  constructor(solo: boolean) {
    this.#solo = solo;
  }

  /** Whether it sleeps between ticks (a solo store): the ticker then reads the earliest after each look. */
  get solo(): boolean {
    return this.#solo;
  }

  /** Whether a look is due at `nowMs`. */
  due(nowMs: number): boolean {
    return !this.#solo || this.#nextMs === undefined || nowMs >= this.#nextMs;
  }

  /** A trigger was made here with its first tick at `atMs`. */
  made(atMs: number | undefined): void {
    this.#made++;
    if (atMs !== undefined && this.#nextMs !== undefined) this.#nextMs = Math.min(this.#nextMs, atMs);
  }

  /** A read of the earliest tick begins: pass what this returns to `read`. */
  begin(): number {
    return this.#made;
  }

  /** The earliest next tick as read (null: no schedule trigger), unless a trigger was made since. */
  read(begun: number, nextMs: number | null): void {
    this.#nextMs = begun === this.#made ? (nextMs ?? Infinity) : undefined;
  }
}
