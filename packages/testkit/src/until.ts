import { setImmediate as nextTurn, setTimeout as pause } from 'node:timers/promises';

export interface UntilOptions {
  /** Named in the failure, so a hang says what never happened. */
  message?: string;
  /** Real time after which `until` gives up. A passing test never waits this long. @default 5000 */
  giveUpMs?: number;
  /**
   * Time between two checks. A condition that queries a database or a server asks it again
   * only this often, instead of keeping a busy machine's core on the question.
   * @default 0 (once per turn of the event loop)
   */
  everyMs?: number;
}

/**
 * Resolves as soon as `condition()` holds, checking it once per turn of the event loop (or
 * every `everyMs`). For states no event announces (a request reaching the stand-in, a socket
 * closing at the other end, a row reaching a status). It has no tolerance window: `giveUpMs`
 * only turns a hang into a failure that names the condition, instead of a test timeout that
 * names nothing. The condition may be async: each check waits for the previous one.
 *
 * @example
 * const run = agent.run({ prompt: 'hi' });
 * await until(() => provider.inFlight === 1, { message: 'the request reaches the stand-in' });
 */
export async function until(
  condition: () => boolean | Promise<boolean>,
  options: UntilOptions = {},
): Promise<void> {
  const giveUpMs = options.giveUpMs ?? 5000;
  const giveUpAt = performance.now() + giveUpMs;
  while (!(await condition())) {
    if (performance.now() > giveUpAt) {
      throw new Error(
        `until: gave up after ${giveUpMs} ms waiting for ${options.message ?? String(condition)}`,
      );
    }
    await (options.everyMs ? pause(options.everyMs) : nextTurn());
  }
}
