import { setImmediate as nextTurn } from 'node:timers/promises';

export interface UntilOptions {
  /** Named in the failure, so a hang says what never happened. */
  message?: string;
  /** Real time after which `until` gives up. A passing test never waits this long. @default 5000 */
  giveUpMs?: number;
}

/**
 * Resolves as soon as `condition()` holds, checking it once per turn of the event loop. For
 * states no event announces (a request reaching the stand-in, a socket closing at the other
 * end). It has no tolerance window: `giveUpMs` only turns a hang into a failure that names
 * the condition, instead of a test timeout that names nothing.
 *
 * @example
 * const run = agent.run({ prompt: 'hi' });
 * await until(() => provider.inFlight === 1, { message: 'the request reaches the stand-in' });
 */
export async function until(condition: () => boolean, options: UntilOptions = {}): Promise<void> {
  const giveUpAt = performance.now() + (options.giveUpMs ?? 5000);
  while (!condition()) {
    if (performance.now() > giveUpAt) {
      throw new Error(
        `until: gave up after ${options.giveUpMs ?? 5000} ms waiting for ${options.message ?? String(condition)}`,
      );
    }
    await nextTurn();
  }
}
