/** At most `limit` holders at once; the rest wait in arrival order. */
export class Semaphore {
  #active = 0;
  #waiting: (() => void)[] = [];

  constructor(readonly limit: number) {}

  async run<T>(body: () => Promise<T>): Promise<T> {
    if (this.#active >= this.limit) await new Promise<void>((resolve) => this.#waiting.push(resolve));
    this.#active++;
    try {
      return await body();
    } finally {
      this.#active--;
      this.#waiting.shift()?.();
    }
  }
}
