import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * The test files that take minutes, started first: with three workers, a file of three minutes
 * started last makes the whole run three minutes longer. A clean clone has no timing cache, so
 * vitest would otherwise start the largest files first, and these are not the largest.
 * Slowest first, in the order listed; the rest keep vitest's own order.
 */
const slowFirst = [
  /soak\/soak\.test\.ts$/,
  /ops\/package\.test\.ts$/,
  /bench\/benches-end(-\w+)?\.test\.ts$/,
  /limits\/burst\.test\.ts$/,
  /process\/cli\.test\.ts$/,
  /held\/thread-lock\.test\.ts$/,
  /process\/tokens\.test\.ts$/,
];

export default class SlowFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const rank = (file: TestSpecification) => {
      const i = slowFirst.findIndex((pattern) => pattern.test(file.moduleId));
      return i === -1 ? slowFirst.length : i;
    };
    return sorted
      .map((file, i) => ({ file, i, rank: rank(file) }))
      .sort((a, b) => a.rank - b.rank || a.i - b.i)
      .map(({ file }) => file);
  }
}
