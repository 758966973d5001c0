/**
 * Conformance cases of budgets, settling, the provider's pause and the adaptive limit
 * (DESIGN.md part 3). They run only when the suite is told the limiter under test supports them
 * (`ConformanceOptions.budgets`): a limiter of your own without budgets still conforms.
 *
 * Real time: every budget is small enough that its refill within a case is a few tokens, so
 * "does not fit" stays true for the short waits, and every "fits" comes with a long wait.
 */
import assert from 'node:assert/strict';
import { ConcurrencyConfigError, ConcurrencyTimeoutError } from './errors.js';
import type { AcquireRequest, ConcurrencyLimiter } from './limiter.js';
import type { ConcurrencyLimiterOptions } from './options.js';
import { waitUntilQueued } from './conformance-fairness.js';
import { describe, settle } from './conformance-support.js';

type AnyLimiter = ConcurrencyLimiter<string>;
type Make = (o: Omit<ConcurrencyLimiterOptions<string>, 'name'>) => Promise<AnyLimiter>;

export interface CapacityCase {
  readonly name: string;
  run(make: Make): Promise<void>;
}

const LONG = 10_000;

/**
 * The cases. `shortWaitMs` is how long a request may wait when it is expected to get nothing.
 */
export function capacityConformanceCases(shortWaitMs: number): CapacityCase[] {
  const expectNone = async (limiter: AnyLimiter, request: AcquireRequest<string>, why: string) => {
    const outcome = await settle(limiter.acquire({ timeoutMs: shortWaitMs, ...request }));
    if (outcome.ok) {
      await limiter.release(outcome.value);
      assert.fail(`expected no grant (${why}), but one was made`);
    }
    assert.ok(
      outcome.error instanceof ConcurrencyTimeoutError,
      `expected ConcurrencyTimeoutError (${why}), got ${describe(outcome.error)}`,
    );
  };

  return [
    {
      name: 'a request budget grants no more than its figure',
      run: async (make) => {
        // 3 a minute: the next one refills in 20 s.
        const limiter = await make({ maxConcurrent: 10, rate: { requestsPerMinute: 3 } });
        for (let i = 0; i < 3; i++) await limiter.release(await limiter.acquire({ timeoutMs: LONG }));
        await expectNone(limiter, {}, 'the request budget is spent');
        const stats = await limiter.stats?.();
        if (stats) {
          assert.equal(stats.budgets?.requests?.capacity, 3);
          assert.equal(stats.budgets?.requests?.available, 0);
          assert.equal(stats.limit, 10);
        }
      },
    },
    {
      name: 'a request larger than a whole budget fails at once with ConcurrencyConfigError',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 2, rate: { tokensPerMinute: 1_000 } });
        const outcome = await settle(
          limiter.acquire({ tokens: { input: 900, output: 200 }, timeoutMs: LONG }),
        );
        if (outcome.ok) await limiter.release(outcome.value);
        assert.ok(
          !outcome.ok && outcome.error instanceof ConcurrencyConfigError,
          `expected ConcurrencyConfigError, got ${outcome.ok ? 'a slot' : describe(outcome.error)}`,
        );
        assert.match(outcome.error.message, /1100/);
        assert.match(outcome.error.message, /1000/);
        assert.match(outcome.error.message, /tokens/);
      },
    },
    {
      name: 'release with usage refunds what the estimate left over; without usage the estimate stays',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 4, rate: { tokensPerMinute: 1_000 } });
        const big = await limiter.acquire({ tokens: { input: 900 }, timeoutMs: LONG });
        await expectNone(limiter, { tokens: { input: 500 } }, '100 tokens left');
        await limiter.release(big, { usage: { input: 400 } });
        // 500 came back: about 600 left.
        const next = await limiter.acquire({ tokens: { input: 550 }, timeoutMs: LONG });
        await limiter.release(next);
        await expectNone(limiter, { tokens: { input: 500 } }, 'a release without usage refunds nothing');
        // A usage over the estimate is charged too: the bucket goes into debt.
        const small = await limiter.acquire({ tokens: { input: 40 }, timeoutMs: LONG });
        await limiter.release(small, { usage: { input: 400, output: 0 }, provider: { status: 200 } });
        await expectNone(limiter, { tokens: { input: 1 } }, 'the usage over the estimate was charged');
        // A request without tokens takes nothing from a token budget, in debt or not.
        await limiter.release(await limiter.acquire({ timeoutMs: LONG }));
      },
    },
    {
      name: 'a request waiting for a budget holds back the requests after it, until it leaves',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 4, rate: { tokensPerMinute: 1_000 } });
        const first = await limiter.acquire({ tokens: { input: 900 }, timeoutMs: LONG });
        const controller = new AbortController();
        const large = settle(
          limiter.acquire({ tokens: { input: 500 }, timeoutMs: LONG, signal: controller.signal }),
        );
        await waitUntilQueued(limiter, 1);
        // 100 tokens are left, enough for this one; it arrived after the large one and waits.
        await expectNone(limiter, { tokens: { input: 50 } }, 'a larger request waits ahead of it');
        controller.abort(new Error('gave up'));
        const outcome = await large;
        if (outcome.ok) await limiter.release(outcome.value);
        assert.ok(!outcome.ok, 'the large request cannot have fit');
        // With the large one gone, the small one goes.
        const small = await limiter.acquire({ tokens: { input: 50 }, timeoutMs: LONG });
        for (const lease of [first, small]) await limiter.release(lease);
      },
    },
    {
      name: 'a provider 429 pauses every new grant until its retry time',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 4, rate: { requestsPerMinute: 1_000 } });
        const lease = await limiter.acquire({ timeoutMs: LONG });
        await limiter.release(lease, { provider: { status: 429, retryAfterMs: 30_000 } });
        await expectNone(limiter, {}, 'paused for 30 s');
        const stats = await limiter.stats?.();
        if (stats) assert.equal(stats.active, 0);
      },
    },
    {
      name: 'a short pause ends by itself',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 4, rate: { tokensPerMinute: 1_000 } });
        await limiter.release(await limiter.acquire({ timeoutMs: LONG }), {
          provider: { status: 503, retryAfterMs: 200 },
        });
        await limiter.release(await limiter.acquire({ timeoutMs: LONG }));
      },
    },
    {
      name: 'a burst of overload answers lowers the adaptive limit once, and the lowered limit holds',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 4, adaptive: true });
        const leases = await Promise.all([1, 2, 3, 4].map(() => limiter.acquire({ timeoutMs: LONG })));
        for (const lease of leases) {
          await limiter.release(lease, { provider: { status: 429, retryAfterMs: 1 } });
        }
        const stats = await limiter.stats?.();
        if (stats)
          assert.equal(stats.limit, 3, 'four answers to grants made before the decrease: one decrease');
        const held = await Promise.all([1, 2, 3].map(() => limiter.acquire({ timeoutMs: LONG })));
        await expectNone(limiter, {}, 'the limit is 3');
        for (const lease of held) await limiter.release(lease);
      },
    },
    {
      name: 'a provider remaining below the bucket lowers it',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 4, rate: { tokensPerMinute: 10_000 } });
        const lease = await limiter.acquire({ tokens: { input: 100 }, timeoutMs: LONG });
        await limiter.release(lease, {
          usage: { input: 100 },
          provider: { status: 200, limits: { tokens: { remaining: 300, resetMs: 1_000 } } },
        });
        await expectNone(limiter, { tokens: { input: 1_000 } }, 'the provider has 300 left');
        await limiter.release(await limiter.acquire({ tokens: { input: 250 }, timeoutMs: LONG }));
      },
    },
  ];
}
