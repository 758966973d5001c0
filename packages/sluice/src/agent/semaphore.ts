/** At most `limit` holders at once; the rest wait in arrival order. */
export class Semaphore {
  #active = 0;
  #waiting: (() => void)[] = [];
  peak = 0;

  constructor(readonly limit: number) {}

  async run<T>(body: () => Promise<T>): Promise<T> {
    if (this.#active >= this.limit) await new Promise<void>((resolve) => this.#waiting.push(resolve));
    this.#active++;
    this.peak = Math.max(this.peak, this.#active);
    try {
      return await body();
    } finally {
      this.#active--;
      this.#waiting.shift()?.();
    }
  }
}
