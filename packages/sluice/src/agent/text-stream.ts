import type { RunResult } from './results.js';

/** A run's answer as it streams: its text deltas to iterate, and the run's result. */
export type TextStream = AsyncIterable<string> & { result: Promise<RunResult> };

/**
 * Starts a run whose text deltas are queued for iteration. The iteration ends when the run
 * does, and fails when it fails; `result` resolves or rejects like the run.
 */
export function textStream(start: (onText: (delta: string) => void) => Promise<RunResult>): TextStream {
  const queue: string[] = [];
  let wake: (() => void) | undefined;
  let finished = false;
  const result = start((delta) => {
    queue.push(delta);
    wake?.();
  });
  const settle = () => {
    finished = true;
    wake?.();
  };
  result.then(settle, settle);
  return {
    result,
    async *[Symbol.asyncIterator]() {
      for (;;) {
        while (queue.length > 0) yield queue.shift()!;
        if (finished) {
          await result; // a failed run fails the iteration too
          return;
        }
        await new Promise<void>((resolve) => (wake = resolve));
        wake = undefined;
      }
    },
  };
}
