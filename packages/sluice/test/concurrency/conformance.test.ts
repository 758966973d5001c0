import { describe, expect, it } from 'vitest';
import {
  concurrencyConformanceCases,
  createConcurrencyLimiter,
  type AcquireRequest,
  type ConcurrencyLease,
  type ConcurrencyLimiter,
  type ConcurrencyLimiterOptions,
} from 'sluice/concurrency';

describe('conformance: in-memory limiter', () => {
  for (const c of concurrencyConformanceCases({
    createLimiter: (o) => createConcurrencyLimiter(o),
    budgets: true,
  })) {
    it(c.name, () => c.run());
  }
});

/**
 * A limiter of someone else's, written before budgets: its release takes one argument, so
 * usage and the provider's answer are dropped. Without `budgets` the suite must pass it.
 */
function withoutBudgets(options: ConcurrencyLimiterOptions<string>): ConcurrencyLimiter<string> {
  const { rate: _rate, adaptive: _adaptive, ...known } = options;
  const inner = createConcurrencyLimiter(known);
  return {
    name: inner.name,
    acquire: (request) => inner.acquire(request && { ...request, tokens: undefined }),
    renew: (lease) => inner.renew(lease),
    release: (lease: ConcurrencyLease<string>) => inner.release(lease),
    stats: () => inner.stats(),
  };
}

describe('conformance: a custom limiter that ignores the second argument of release', () => {
  for (const c of concurrencyConformanceCases({ createLimiter: withoutBudgets })) {
    it(c.name, () => c.run());
  }
});

// Deliberately broken limiters. The suite is only worth something if it catches each of them.

/** Grants every request at once, whatever the limit. */
function overGranting(options: ConcurrencyLimiterOptions<string>): ConcurrencyLimiter<string> {
  const inner = createConcurrencyLimiter({ ...options, maxConcurrent: 1_000 });
  return {
    name: inner.name,
    acquire: (request) => inner.acquire({ ...request, workload: request?.workload }),
    renew: (lease) => inner.renew(lease),
    release: (lease) => inner.release(lease),
    stats: () => inner.stats(),
  };
}

/** Correct allocation, but lease ids come from a counter that wraps around. */
function reusingIds(options: ConcurrencyLimiterOptions<string>): ConcurrencyLimiter<string> {
  const inner = createConcurrencyLimiter(options);
  const real = new Map<string, ConcurrencyLease<string>>();
  let counter = 0;
  return {
    name: inner.name,
    async acquire(request?: AcquireRequest<string>) {
      const lease = await inner.acquire(request);
      const id = `lease-${counter++ % 8}`;
      real.set(id, lease);
      return { ...lease, id };
    },
    async renew(lease) {
      const inside = real.get(lease.id);
      const renewed = inside && (await inner.renew(inside));
      return renewed && { ...renewed, id: lease.id };
    },
    async release(lease) {
      const inside = real.get(lease.id);
      if (inside) await inner.release(inside);
    },
    stats: () => inner.stats(),
  };
}

/** Rejects a cancelled acquire but leaves its request in the queue: the slot it later gets is never returned. */
function leakingOnCancel(options: ConcurrencyLimiterOptions<string>): ConcurrencyLimiter<string> {
  const inner = createConcurrencyLimiter(options);
  return {
    name: inner.name,
    acquire(request?: AcquireRequest<string>) {
      const { signal, ...rest } = request ?? {};
      if (signal?.aborted) return Promise.reject(signal.reason);
      return new Promise((resolve, reject) => {
        signal?.addEventListener('abort', () => reject(signal.reason), { once: true });
        inner.acquire(rest).then(resolve, reject);
      });
    },
    renew: (lease) => inner.renew(lease),
    release: (lease) => inner.release(lease),
  };
}

/** Correct in every other way, but drops the key: each workload is served first in, first out. */
function ignoringKeys(options: ConcurrencyLimiterOptions<string>): ConcurrencyLimiter<string> {
  const inner = createConcurrencyLimiter(options);
  return {
    name: inner.name,
    acquire: (request) => inner.acquire({ ...request, key: undefined }),
    renew: (lease) => inner.renew(lease),
    release: (lease) => inner.release(lease),
    stats: () => inner.stats(),
  };
}

async function failingCases(
  createLimiter: (o: ConcurrencyLimiterOptions<string>) => ConcurrencyLimiter<string>,
) {
  const cases = concurrencyConformanceCases({ createLimiter, leaseTtlMs: 150, shortWaitMs: 60 });
  // Each case has its own limiters, so they can run side by side. A broken limiter may leave
  // a case waiting forever; past the cap it counts as failed.
  const outcomes = await Promise.all(
    cases.map(async (c) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const cap = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('case did not finish')), 5_000);
      });
      try {
        await Promise.race([c.run(), cap]);
        return undefined;
      } catch {
        return c.name;
      } finally {
        clearTimeout(timer);
      }
    }),
  );
  return outcomes.filter((name): name is string => name !== undefined);
}

describe('conformance suite catches broken limiters', () => {
  it('(control) the in-memory limiter passes with the same short timings', async () => {
    expect(await failingCases((o) => createConcurrencyLimiter(o))).toEqual([]);
  }, 60_000);

  it('a limiter that grants past the limit', async () => {
    const failed = await failingCases(overGranting);
    expect(failed).toContain('allocates atomically under many concurrent acquires');
    expect(failed).toContain('grants up to maxConcurrent at once, then makes requests wait');
  }, 60_000);

  it('a limiter that reuses lease ids', async () => {
    const failed = await failingCases(reusingIds);
    expect(failed).toContain('never hands out a lease id twice');
  }, 60_000);

  it('a limiter whose acquire leaks a slot on cancel', async () => {
    const failed = await failingCases(leakingOnCancel);
    expect(failed).toContain('an aborted signal removes the waiter and rejects with its reason');
    expect(failed).toContain('cancelling at the moment of a grant never leaks a slot');
  }, 60_000);

  it('a limiter that ignores budgets fails the budget cases when it claims them', async () => {
    const cases = concurrencyConformanceCases({
      createLimiter: withoutBudgets,
      budgets: true,
      shortWaitMs: 60,
    });
    const failed: string[] = [];
    for (const c of cases.filter((c) => /budget|429|remaining|usage|whole budget|adaptive/.test(c.name))) {
      await c.run().catch(() => failed.push(c.name));
    }
    expect(failed).toEqual([
      'a request budget grants no more than its figure',
      'a request larger than a whole budget fails at once with ConcurrencyConfigError',
      'release with usage refunds what the estimate left over; without usage the estimate stays',
      'a request waiting for a budget holds back the requests after it, until it leaves',
      'a provider 429 pauses every new grant until its retry time',
      'a burst of overload answers lowers the adaptive limit once, and the lowered limit holds',
      'a provider remaining below the bucket lowers it',
    ]);
  }, 60_000);

  it('a limiter that ignores keys', async () => {
    const failed = await failingCases(ignoringKeys);
    for (const name of [
      'keys take turns in a workload, each key first in, first out',
      'requests without a key share one key and keep their arrival order',
      "a cancelled request leaves its key's turn to the key's next request",
      'keys are fair within a workload and priority still ranks workloads',
      'a key that is not a string of 1 to 256 characters is a ConcurrencyConfigError',
    ]) {
      expect(failed).toContain(name);
    }
  }, 60_000);
});
