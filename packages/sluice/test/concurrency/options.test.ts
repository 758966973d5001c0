import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  createConcurrencyLimiter,
  type ConcurrencyLimiterOptions,
} from 'sluice/concurrency';

function configError(options: unknown): ConcurrencyConfigError {
  try {
    createConcurrencyLimiter(options as ConcurrencyLimiterOptions<string>);
  } catch (error) {
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    return error as ConcurrencyConfigError;
  }
  throw new Error('expected ConcurrencyConfigError');
}

describe('limiter options', () => {
  it.each([
    [{ maxConcurrent: 0 }, 'maxConcurrent', 'Expected `maxConcurrent` to be a whole number >= 1, got `0`'],
    [{ maxConcurrent: 2.5 }, 'maxConcurrent', 'got `2.5`'],
    [{ maxConcurrent: '4' }, 'maxConcurrent', 'got `"4"`'],
    [{}, 'maxConcurrent', 'got `undefined`'],
    [
      { maxConcurrent: 2, maxQueued: -1 },
      'maxQueued',
      'Expected `maxQueued` to be a whole number >= 0, got `-1`',
    ],
    [{ maxConcurrent: 2, leaseTtlMs: 0 }, 'leaseTtlMs', 'got `0`'],
    [{ maxConcurrent: 2, name: '' }, 'name', 'a non-empty string'],
    [{ maxConcurrent: 2, maxConcurent: 3 }, 'maxConcurent', 'a known option'],
    [{ maxConcurrent: 2, workloads: {} }, 'workloads', 'at least one workload'],
    [{ maxConcurrent: 2, workloads: { a: 3 } }, 'workloads.a', 'an object'],
    [
      { maxConcurrent: 8, workloads: { a: { maxConcurrent: 12 } } },
      'workloads.a.maxConcurrent',
      "Expected `workloads.a.maxConcurrent` to be a whole number between 1 and 8 (the limiter's maxConcurrent), got `12`",
    ],
    [
      { maxConcurrent: 8, workloads: { a: { maxConcurrent: 2, reserved: 3 } } },
      'workloads.a.reserved',
      "between 0 and 2 (the workload's ceiling), got `3`",
    ],
    [{ maxConcurrent: 8, workloads: { a: { reserved: -1 } } }, 'workloads.a.reserved', 'got `-1`'],
    [{ maxConcurrent: 8, workloads: { a: { priority: 1.5 } } }, 'workloads.a.priority', 'got `1.5`'],
    [{ maxConcurrent: 8, workloads: { a: { maxWaitMs: -5 } } }, 'workloads.a.maxWaitMs', 'got `-5`'],
    [
      { maxConcurrent: 8, workloads: { a: { reserve: 1 } } },
      'workloads.a.reserve',
      'a known workload option',
    ],
    [
      { maxConcurrent: 8, workloads: { a: { reserved: 5 }, b: { reserved: 4 } } },
      'workloads.*.reserved',
      'Expected the reservations to sum to at most `maxConcurrent` (8), got 9 (a: 5, b: 4)',
    ],
    [
      { maxConcurrent: 4, workloads: { a: { reserved: 4 }, b: {} } },
      'workloads.b.reserved',
      'Workload `b` could never get a slot',
    ],
    [
      { maxConcurrent: 4, workloads: { a: {}, b: {} }, defaultWorkload: 'c' },
      'defaultWorkload',
      'Expected `defaultWorkload` to be one of the workloads ("a", "b"), got `"c"`',
    ],
    [{ maxConcurrent: 4, defaultWorkload: 'x' }, 'defaultWorkload', '("default")'],
  ])('refuses %j, naming `%s`', (options, field, message) => {
    const error = configError(options);
    expect(error.field).toBe(field);
    expect(error.message).toContain(message);
    expect(error.limiter).toBe('default');
  });

  it('names the limiter in its errors', () => {
    expect(configError({ name: 'claude', maxConcurrent: -1 }).limiter).toBe('claude');
  });

  it('fills in the defaults', () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 3 });
    expect(limiter.name).toBe('default');
    expect(limiter.limits).toMatchObject({
      maxConcurrent: 3,
      maxQueued: undefined,
      leaseTtlMs: 30_000,
      defaultWorkload: 'default',
      sharedSlots: 3,
    });
    expect(limiter.limits.workloads).toEqual([
      { name: 'default', index: 0, maxConcurrent: 3, reserved: 0, priority: 0, maxWaitMs: undefined },
    ]);
    expect(Object.isFrozen(limiter.limits)).toBe(true);
    expect(limiter.stats()).toEqual({
      active: 0,
      queued: 0,
      limit: 3,
      workloads: { default: { active: 0, queued: 0 } },
    });
  });

  it('picks the default workload: `default` if present, else the only one, else none', () => {
    expect(
      createConcurrencyLimiter({ maxConcurrent: 2, workloads: { default: {}, b: {} } }).limits
        .defaultWorkload,
    ).toBe('default');
    expect(
      createConcurrencyLimiter({ maxConcurrent: 2, workloads: { only: {} } }).limits.defaultWorkload,
    ).toBe('only');
    const several = createConcurrencyLimiter({ maxConcurrent: 2, workloads: { a: {}, b: {} } });
    expect(several.limits.defaultWorkload).toBeUndefined();
    expect(() => several.validateWorkload()).toThrow(/several workloads \("a", "b"\) and no defaultWorkload/);
    expect(several.validateWorkload('b')).toBe('b');
    expect(() => several.validateWorkload('c')).toThrow(ConcurrencyConfigError);
  });
});
