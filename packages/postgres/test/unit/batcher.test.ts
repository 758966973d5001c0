import { describe, expect, it } from 'vitest';
import { Batcher } from '../../src/batcher.js';

function deferred<T>() {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

describe('Batcher', () => {
  it('runs one batch at a time; what comes meanwhile goes into the next, together', async () => {
    const runs: { inputs: number[]; done: ReturnType<typeof deferred<number[]>> }[] = [];
    const batcher = new Batcher<number, number>((inputs) => {
      const done = deferred<number[]>();
      runs.push({ inputs, done });
      return done.promise;
    });
    const first = [batcher.submit(1), batcher.submit(2)]; // one tick: one batch
    await Promise.resolve();
    const later = [batcher.submit(3), batcher.submit(4)];
    await Promise.resolve();
    expect(runs.map((r) => r.inputs)).toEqual([[1, 2]]);
    runs[0]!.done.resolve([10, 20]);
    expect(await Promise.all(first)).toEqual([10, 20]);
    await Promise.resolve();
    expect(runs.map((r) => r.inputs)).toEqual([
      [1, 2],
      [3, 4],
    ]);
    runs[1]!.done.resolve([30, 40]);
    expect(await Promise.all(later)).toEqual([30, 40]);
  });

  it('a failed run rejects its whole batch, and the next batch still runs', async () => {
    let calls = 0;
    const batcher = new Batcher<string, string>(async (inputs) => {
      if (calls++ === 0) throw new Error('database gone');
      return inputs.map((i) => i.toUpperCase());
    });
    const failed = [batcher.submit('a'), batcher.submit('b')].map((p) => p.catch((e: Error) => e.message));
    expect(await Promise.all(failed)).toEqual(['database gone', 'database gone']);
    expect(await batcher.submit('c')).toBe('C');
  });
});
