/** What the conformance case files share: the outcome of a promise and a readable error. */

export type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** The promise's outcome, without throwing. */
export function settle<T>(promise: Promise<T>): Promise<Settled<T>> {
  return promise.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, error }),
  );
}

/** An error as its name and message, for assertion messages. */
export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
