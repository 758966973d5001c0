/**
 * Single flight with batching: at most one run in flight; everything submitted while it is
 * under way waits and goes into the next run together. Submissions of one tick share a run.
 *
 * @example
 * const passes = new Batcher((inputs: PassInput[]) => runPass(inputs)); // one result per input
 * const result = await passes.submit({ release: lease.id });
 */
export class Batcher<I, R> {
  #queue: { input: I; resolve(result: R): void; reject(error: unknown): void }[] = [];
  #running = false;

  /** `run` answers a batch with one result per input, in order, or rejects for all of them. */
  constructor(private readonly run: (inputs: I[]) => Promise<R[]>) {}

  submit(input: I): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.#queue.push({ input, resolve, reject });
      if (this.#running) return;
      this.#running = true;
      queueMicrotask(() => void this.#drain());
    });
  }

  async #drain(): Promise<void> {
    while (this.#queue.length > 0) {
      const batch = this.#queue;
      this.#queue = [];
      try {
        const results = await this.run(batch.map((b) => b.input));
        batch.forEach((b, i) => b.resolve(results[i]!));
      } catch (error) {
        for (const b of batch) b.reject(error);
      }
    }
    this.#running = false;
  }
}
