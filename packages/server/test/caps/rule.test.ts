import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { firstFull, hasRoom, highestFitting } from '../../src/runs/caps.js';

/** The cap rule alone (runs/caps.ts): a table of cases, and the two forms of it agreeing. */

describe('hasRoom', () => {
  const cases: [count: number, cap: number, more: number, room: boolean][] = [
    [0, 0, 1, true], // no cap
    [1_000, 0, 1, true],
    [0, 0, 1_000, true],
    [0, 1, 1, true],
    [1, 1, 1, false], // at the cap
    [2, 1, 1, false], // a count that drifted past it
    [0, 3, 3, true], // a batch that fills the cap exactly
    [0, 3, 4, false],
    [2, 3, 1, true],
    [2, 3, 2, false],
    [3, 3, 1, false],
    [4, 5, 1, true],
    [5, 5, 1, false],
    [-1, 1, 1, true], // never happens (counts are counts), shown for the boundary
  ];
  it.each(cases)('count %i, cap %i, %i more: room %s', (count, cap, more, room) => {
    expect(hasRoom(count, cap, more)).toBe(room);
  });
  it('one more is the default', () => {
    expect(hasRoom(2, 3)).toBe(true);
    expect(hasRoom(3, 3)).toBe(false);
  });
});

describe('highestFitting', () => {
  const cases: [cap: number, k: number, highest: number | null][] = [
    [0, 1, null],
    [0, 50, null],
    [1, 1, 0],
    [3, 1, 2],
    [3, 3, 0],
    [3, 4, -1], // no count fits: the fast path then writes nothing
    [128, 128, 0],
  ];
  it.each(cases)('cap %i, k %i: %s', (cap, k, highest) => {
    expect(highestFitting(cap, k)).toBe(highest);
  });

  it('a count is at most the bound exactly when k more have room (the SQL and the TypeScript forms agree)', () => {
    fc.assert(
      fc.property(fc.nat(40), fc.nat(40), fc.integer({ min: 1, max: 40 }), (count, cap, k) => {
        const highest = highestFitting(cap, k);
        // sluice_admit_runs refuses a batch when `count > highest`; a NULL bound refuses nothing.
        const sqlFits = highest === null || !(count > highest);
        expect(sqlFits).toBe(hasRoom(count, cap, k));
      }),
    );
  });
});

describe('firstFull', () => {
  const level = (scope: 'tenant' | 'project', count: number, cap: number) => ({ scope, count, cap });
  const cases: [name: string, levels: ReturnType<typeof level>[], full: 'tenant' | 'project' | undefined][] =
    [
      ['no caps', [level('tenant', 9, 0), level('project', 9, 0)], undefined],
      ['room at both', [level('tenant', 1, 3), level('project', 0, 2)], undefined],
      ['tenant full', [level('tenant', 3, 3), level('project', 0, 2)], 'tenant'],
      ['project full', [level('tenant', 1, 3), level('project', 2, 2)], 'project'],
      ['both full: the tenant is reported', [level('tenant', 3, 3), level('project', 2, 2)], 'tenant'],
      ['project full, tenant uncapped', [level('tenant', 50, 0), level('project', 1, 1)], 'project'],
      ['no levels', [], undefined],
    ];
  it.each(cases)('%s', (_, levels, full) => {
    expect(firstFull(levels)?.scope).toBe(full);
  });
});
