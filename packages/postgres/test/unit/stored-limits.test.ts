import { describe, expect, it } from 'vitest';
import { resolveLimiterOptions } from 'sluice/concurrency';
import { allocationLimits, differences, storedForm } from '../../src/stored-limits.js';

const limits = resolveLimiterOptions({
  name: 'claude',
  maxConcurrent: 8,
  maxQueued: 20,
  workloads: {
    interactive: { reserved: 2, priority: 10, maxWaitMs: 60_000 },
    background: { maxConcurrent: 6 },
  },
});

describe('stored limits', () => {
  it('stores resolved limits as JSON-safe values, absent ones as null', () => {
    const stored = storedForm(limits);
    expect(JSON.parse(JSON.stringify(stored))).toEqual(stored);
    expect(stored).toEqual({
      maxConcurrent: 8,
      maxQueued: 20,
      leaseTtlMs: 30_000,
      defaultWorkload: null,
      workloads: [
        { name: 'interactive', maxConcurrent: 8, reserved: 2, priority: 10, maxWaitMs: 60_000 },
        { name: 'background', maxConcurrent: 6, reserved: 0, priority: 0, maxWaitMs: null },
      ],
    });
  });

  it('names every difference, or none', () => {
    const mine = storedForm(limits);
    expect(differences(mine, mine)).toEqual([]);
    const other = storedForm(
      resolveLimiterOptions({
        maxConcurrent: 6,
        maxQueued: 20,
        workloads: {
          interactive: { reserved: 1, priority: 10, maxWaitMs: 60_000 },
          background: { maxConcurrent: 6 },
        },
      }),
    );
    expect(differences(mine, other)).toEqual([
      'maxConcurrent 8 here, 6 stored',
      'workloads.interactive.maxConcurrent 8 here, 6 stored',
      'workloads.interactive.reserved 2 here, 1 stored',
    ]);
    const renamed = storedForm(
      resolveLimiterOptions({ maxConcurrent: 8, maxQueued: 20, workloads: { chat: {} } }),
    );
    expect(differences(mine, renamed)).toEqual([
      'defaultWorkload null here, chat stored',
      'workloads (interactive, background) here, (chat) stored',
    ]);
  });

  it('gives allocate the same shared slots as the resolved limits', () => {
    const forRules = allocationLimits(storedForm(limits));
    expect(forRules.maxConcurrent).toBe(limits.maxConcurrent);
    expect(forRules.sharedSlots).toBe(limits.sharedSlots);
    expect(forRules.workloads.map((w) => [w.maxConcurrent, w.reserved, w.priority])).toEqual(
      limits.workloads.map((w) => [w.maxConcurrent, w.reserved, w.priority]),
    );
  });
});
