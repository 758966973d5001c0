// Type-level checks: `npm test` type-checks this file, so each `@ts-expect-error` below fails
// the run if the line it marks ever compiles.
import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  ConcurrencyConfigError,
  createConcurrencyLimiter,
  type ConcurrencyLimiter,
  type ConcurrencyStats,
  type InMemoryConcurrencyLimiter,
} from 'sluice';

describe('typed workload names', () => {
  it('come from the workloads keys', async () => {
    const claude = createConcurrencyLimiter({
      maxConcurrent: 8,
      workloads: { interactive: { reserved: 2 }, background: {} },
      defaultWorkload: 'background',
    });
    expectTypeOf(claude).toEqualTypeOf<InMemoryConcurrencyLimiter<'interactive' | 'background'>>();
    expectTypeOf(claude).toMatchTypeOf<ConcurrencyLimiter<'interactive' | 'background'>>();
    expectTypeOf(claude.stats()).toEqualTypeOf<ConcurrencyStats<'interactive' | 'background'>>();
    expectTypeOf(claude.stats().workloads).toHaveProperty('interactive');

    const lease = await claude.acquire({ workload: 'interactive' });
    expectTypeOf(lease.workload).toEqualTypeOf<'interactive' | 'background'>();
    await claude.release(lease);

    // @ts-expect-error a misspelt workload does not compile
    void claude.acquire({ workload: 'interactiv' }).catch(() => undefined);
  });

  it('check defaultWorkload against the same names', () => {
    expect(() =>
      createConcurrencyLimiter({
        maxConcurrent: 2,
        workloads: { a: {}, b: {} },
        // @ts-expect-error not one of the workloads
        defaultWorkload: 'c',
      }),
    ).toThrow(ConcurrencyConfigError);
  });

  it("give a limiter without workloads the one workload 'default'", () => {
    const plain = createConcurrencyLimiter({ maxConcurrent: 2 });
    expectTypeOf(plain).toEqualTypeOf<InMemoryConcurrencyLimiter<'default'>>();
    expectTypeOf(plain.stats().workloads).toEqualTypeOf<{
      readonly default: { readonly active: number; readonly queued: number };
    }>();
    // @ts-expect-error only 'default' exists
    void plain.acquire({ workload: 'other' }).catch(() => undefined);
  });
});
