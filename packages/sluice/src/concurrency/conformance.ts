import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ConcurrencyError } from './errors.js';
import { ConcurrencyConfigError, ConcurrencyQueueFullError, ConcurrencyTimeoutError } from './errors.js';
import type { AcquireRequest, ConcurrencyLease, ConcurrencyLimiter } from './limiter.js';
import { cancelConformanceCases } from './conformance-cancel.js';
import { capacityConformanceCases } from './conformance-capacity.js';
import { fairnessConformanceCases, waitUntilQueued } from './conformance-fairness.js';
import { describe, settle } from './conformance-support.js';
import type { ConcurrencyLimiterOptions } from './options.js';

type AnyLimiter = ConcurrencyLimiter<string>;

export interface ConformanceOptions {
  /**
   * Makes a new limiter for the options a case needs (the same shape as
   * `createConcurrencyLimiter`'s). Each case uses a fresh `name`, so limiters that share
   * storage by name do not see each other's slots.
   */
  createLimiter(options: ConcurrencyLimiterOptions<string>): AnyLimiter | Promise<AnyLimiter>;
  /** Called after each case for every limiter it created (close pools, stop pollers). */
  disposeLimiter?(limiter: AnyLimiter): void | Promise<void>;
  /**
   * TTL for the expiry and renewal cases; those take about 2.5x this long.
   * @default 400
   */
  leaseTtlMs?: number;
  /**
   * How long a case lets a request wait when it expects it to get no slot.
   * @default 150
   */
  shortWaitMs?: number;
  /**
   * Whether the limiter under test supports budgets, provider feedback and the adaptive
   * limit (`rate`, `adaptive`, usage and `provider` at release): adds the cases of DESIGN.md
   * part 3. Leave it off for a limiter without them; it must still accept (and may ignore)
   * the second argument of `release`.
   * @default false
   */
  budgets?: boolean;
}

export interface ConformanceCase {
  readonly name: string;
  run(): Promise<void>;
}

let caseCounter = 0;

/**
 * The checks any `ConcurrencyLimiter` must pass: atomic allocation, expiring leases,
 * idempotent renew and release, unique lease ids, cancel-safe acquire, the workload rules,
 * queue overflow and deadlines, and fair queuing by key. Only the public interface is used, and real time.
 *
 * @example
 * for (const c of concurrencyConformanceCases({ createLimiter: (o) => createMyLimiter(o) })) {
 *   it(c.name, () => c.run(), 20_000);
 * }
 */
export function concurrencyConformanceCases(options: ConformanceOptions): ConformanceCase[] {
  const ttl = options.leaseTtlMs ?? 400;
  const short = options.shortWaitMs ?? 150;
  // A wait long enough that a request expected to succeed does; not a timing assertion.
  const long = 10_000;

  const withLimiters =
    (
      body: (
        make: (o: Omit<ConcurrencyLimiterOptions<string>, 'name'>) => Promise<AnyLimiter>,
      ) => Promise<void>,
    ) =>
    async () => {
      const made: AnyLimiter[] = [];
      const name = `conformance-${process.pid}-${Date.now().toString(36)}-${++caseCounter}`;
      const make = async (o: Omit<ConcurrencyLimiterOptions<string>, 'name'>) => {
        const limiter = await options.createLimiter({ ...o, name });
        made.push(limiter);
        return limiter;
      };
      try {
        await body(make);
      } finally {
        for (const limiter of made) await options.disposeLimiter?.(limiter);
      }
    };

  const expectTimeout = async (limiter: AnyLimiter, request: AcquireRequest<string> = {}) => {
    const outcome = await settle(limiter.acquire({ timeoutMs: short, ...request }));
    if (outcome.ok) {
      await limiter.release(outcome.value);
      assert.fail(
        `expected no slot${request.workload ? ` for workload ${request.workload}` : ''}, but one was granted`,
      );
    }
    assert.ok(
      outcome.error instanceof ConcurrencyTimeoutError,
      `expected ConcurrencyTimeoutError, got ${describe(outcome.error)}`,
    );
  };

  const cases: ConformanceCase[] = [
    {
      name: 'grants up to maxConcurrent at once, then makes requests wait',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 3 });
        const leases = await Promise.all([1, 2, 3].map(() => limiter.acquire({ timeoutMs: long })));
        await expectTimeout(limiter);
        for (const lease of leases) await limiter.release(lease);
        await limiter.release(await limiter.acquire({ timeoutMs: long }));
      }),
    },
    {
      name: 'allocates atomically under many concurrent acquires',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 4 });
        let inFlight = 0;
        let peak = 0;
        const ids = new Set<string>();
        const one = async () => {
          const lease = await limiter.acquire({ timeoutMs: long * 2 });
          inFlight++;
          peak = Math.max(peak, inFlight);
          ids.add(lease.id);
          await sleep(1);
          inFlight--;
          await limiter.release(lease);
        };
        await Promise.all(Array.from({ length: 60 }, one));
        assert.ok(peak <= 4, `expected at most 4 slots in use at once, saw ${peak}`);
        assert.equal(ids.size, 60, 'every grant must carry a new lease id');
      }),
    },
    {
      name: 'a released slot goes to the next waiter',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        const a = await limiter.acquire();
        const waiting = limiter.acquire({ timeoutMs: long });
        await waitUntilQueued(limiter, 1);
        await limiter.release(a);
        const b = await waiting;
        assert.notEqual(b.id, a.id);
        await limiter.release(b);
      }),
    },
    {
      name: 'a lease that is not renewed expires and its slot is handed on',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, leaseTtlMs: ttl });
        const a = await limiter.acquire();
        assert.ok(a.expiresAt > a.acquiredAt, 'a lease must say when it expires');
        const b = await limiter.acquire({ timeoutMs: long });
        assert.equal(await limiter.renew(a), undefined, 'renewing an expired lease must resolve undefined');
        await limiter.release(a);
        assert.ok(
          await limiter.renew(b),
          'the new holder keeps its slot after the old lease is released late',
        );
        await expectTimeout(limiter);
        await limiter.release(b);
      }),
    },
    {
      name: 'renewal keeps a lease valid past its ttl',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, leaseTtlMs: ttl });
        let lease: ConcurrencyLease<string> | undefined = await limiter.acquire();
        const rival = settle(limiter.acquire({ timeoutMs: Math.round(ttl * 2.5) }));
        for (let i = 0; i < 8 && lease; i++) {
          await sleep(ttl / 3);
          lease = await limiter.renew(lease);
        }
        assert.ok(lease, 'a lease renewed every third of its ttl must stay valid');
        const outcome = await rival;
        if (outcome.ok) await limiter.release(outcome.value);
        assert.ok(!outcome.ok, 'nobody else may get the slot of a lease that is being renewed');
        await limiter.release(lease);
      }),
    },
    {
      name: "release takes the request's usage and the provider's answer, and frees the slot",
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        const a = await limiter.acquire({ tokens: { input: 1_200, output: 800 } });
        await limiter.release(a, {
          usage: { input: 950, output: 312 },
          provider: { status: 200, limits: { tokens: { limit: 100_000, remaining: 99_000, resetMs: 600 } } },
        });
        const b = await limiter.acquire({ timeoutMs: long });
        await expectTimeout(limiter);
        await limiter.release(b, { usage: { input: 10 } });
        await limiter.release(b, { usage: { input: 10 } });
        await limiter.release(await limiter.acquire({ timeoutMs: long }));
      }),
    },
    {
      name: 'renew and release are idempotent',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 2 });
        const a = await limiter.acquire();
        const b = await limiter.acquire();
        assert.ok(await limiter.renew(a));
        assert.ok(await limiter.renew(a), 'renewing twice must keep the lease');
        await limiter.release(a);
        await limiter.release(a);
        assert.equal(await limiter.renew(a), undefined, 'a released lease cannot be renewed');
        // Two releases of one lease free one slot, not two.
        const c = await limiter.acquire({ timeoutMs: long });
        await expectTimeout(limiter);
        await limiter.release(b);
        await limiter.release(c);
      }),
    },
    {
      name: 'never hands out a lease id twice',
      run: withLimiters(async (make) => {
        const first = await make({ maxConcurrent: 3 });
        const second = await make({ maxConcurrent: 3 });
        const ids = new Set<string>();
        for (let i = 0; i < 60; i++) {
          const l = i % 2 ? first : second;
          const held = await Promise.all([l.acquire(), l.acquire()]);
          for (const lease of held) {
            assert.ok(!ids.has(lease.id), `lease id ${lease.id} was handed out twice`);
            ids.add(lease.id);
            await l.release(lease);
          }
        }
      }),
    },
    ...cancelConformanceCases().map((c) => ({
      name: c.name,
      run: withLimiters((make) => c.run(make, expectTimeout)),
    })),
    {
      name: 'reserved slots are never lent to another workload',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 3, workloads: { vip: { reserved: 1 }, bulk: {} } });
        const b1 = await limiter.acquire({ workload: 'bulk' });
        const b2 = await limiter.acquire({ workload: 'bulk' });
        await expectTimeout(limiter, { workload: 'bulk' });
        const v = await limiter.acquire({ workload: 'vip', timeoutMs: long });
        for (const lease of [b1, b2, v]) await limiter.release(lease);
      }),
    },
    {
      name: "a workload's ceiling holds and does not block another workload",
      run: withLimiters(async (make) => {
        const limiter = await make({
          maxConcurrent: 4,
          workloads: { capped: { maxConcurrent: 1, priority: 10 }, open: {} },
        });
        const c1 = await limiter.acquire({ workload: 'capped' });
        const c2 = settle(limiter.acquire({ workload: 'capped', timeoutMs: long }));
        await waitUntilQueued(limiter, 1);
        // `capped` waits longer and ranks higher, yet `open` has room and goes first.
        const o1 = await limiter.acquire({ workload: 'open', timeoutMs: long });
        const o2 = await limiter.acquire({ workload: 'open', timeoutMs: long });
        await limiter.release(c1);
        const second = await c2;
        assert.ok(second.ok, 'the capped workload gets its slot once its own one is back');
        for (const lease of [o1, o2, second.value]) await limiter.release(lease);
      }),
    },
    {
      name: 'priority picks among workloads with room',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, workloads: { high: { priority: 10 }, low: {} } });
        const order: string[] = [];
        const holder = await limiter.acquire({ workload: 'low' });
        const low = limiter.acquire({ workload: 'low', timeoutMs: long }).then((l) => (order.push('low'), l));
        await waitUntilQueued(limiter, 1);
        const high = limiter
          .acquire({ workload: 'high', timeoutMs: long })
          .then((l) => (order.push('high'), l));
        await waitUntilQueued(limiter, 2);
        await limiter.release(holder);
        await limiter.release(await high);
        await limiter.release(await low);
        assert.deepEqual(order, ['high', 'low']);
      }),
    },
    {
      name: 'ties go to the longest waiter, and each workload is first in, first out',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, workloads: { a: {}, b: {} } });
        const order: string[] = [];
        const holder = await limiter.acquire({ workload: 'a' });
        const pending: Promise<ConcurrencyLease<string>>[] = [];
        const labels = ['a1', 'b1', 'a2', 'b2', 'a3'];
        for (const [i, label] of labels.entries()) {
          pending.push(
            limiter
              .acquire({ workload: label.slice(0, 1), timeoutMs: long })
              .then((l) => (order.push(label), l)),
          );
          await waitUntilQueued(limiter, i + 1);
        }
        // Release one slot at a time and see who gets it.
        const remaining = new Set(pending.keys());
        let current = holder;
        while (remaining.size > 0) {
          await limiter.release(current);
          const [index, lease] = await Promise.race(
            [...remaining].map((i) => pending[i]!.then((l) => [i, l] as const)),
          );
          remaining.delete(index);
          current = lease;
        }
        await limiter.release(current);
        assert.deepEqual(order, labels);
      }),
    },
    {
      name: 'a full queue rejects with ConcurrencyQueueFullError',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, maxQueued: 2 });
        const holder = await limiter.acquire();
        const controller = new AbortController();
        const w1 = settle(limiter.acquire({ signal: controller.signal, timeoutMs: long }));
        const w2 = settle(limiter.acquire({ timeoutMs: long }));
        await waitUntilQueued(limiter, 2);
        const overflow = await settle(limiter.acquire({ timeoutMs: long }));
        if (overflow.ok) await limiter.release(overflow.value);
        assert.ok(
          !overflow.ok && overflow.error instanceof ConcurrencyQueueFullError,
          `expected ConcurrencyQueueFullError, got ${overflow.ok ? 'a slot' : describe(overflow.error)}`,
        );
        // A place freed in the queue can be taken again.
        controller.abort(new Error('leave'));
        await w1;
        const w3 = settle(limiter.acquire({ timeoutMs: long }));
        await waitUntilQueued(limiter, 2);
        await limiter.release(holder);
        for (const w of [w2, w3]) {
          const outcome = await w;
          assert.ok(outcome.ok, 'queued requests are served once slots free up');
          await limiter.release(outcome.value);
        }
      }),
    },
    {
      name: "a workload's maxWaitMs ends the wait with ConcurrencyTimeoutError",
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, workloads: { quick: { maxWaitMs: short } } });
        const holder = await limiter.acquire();
        const outcome = await settle(
          limiter.acquire({ runId: 'run-1', rootRunId: 'root-1', requestId: 'req-1' }),
        );
        if (outcome.ok) await limiter.release(outcome.value);
        assert.ok(
          !outcome.ok && outcome.error instanceof ConcurrencyTimeoutError,
          'expected ConcurrencyTimeoutError',
        );
        const error = outcome.error as ConcurrencyTimeoutError;
        assert.equal(error.limiter, limiter.name);
        assert.equal(error.workload, 'quick');
        assert.equal(error.runId, 'run-1');
        assert.equal(error.rootRunId, 'root-1');
        assert.equal(error.requestId, 'req-1');
        await limiter.release(holder);
        const next = await limiter.acquire({ timeoutMs: long });
        await limiter.release(next);
        const stats = await limiter.stats?.();
        if (stats) assert.equal(stats.queued, 0, 'a timed-out request must leave the queue');
      }),
    },
    {
      name: "the caller's deadline ends the wait when it comes before maxWaitMs",
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 1, workloads: { patient: { maxWaitMs: 60_000 } } });
        const holder = await limiter.acquire();
        await expectTimeout(limiter, { timeoutMs: short });
        await limiter.release(holder);
      }),
    },
    {
      name: 'an unknown workload is a ConcurrencyConfigError',
      run: withLimiters(async (make) => {
        const limiter = await make({ maxConcurrent: 2, workloads: { known: {} } });
        const outcome = await settle(limiter.acquire({ workload: 'unknown' }));
        if (outcome.ok) await limiter.release(outcome.value);
        assert.ok(
          !outcome.ok && outcome.error instanceof ConcurrencyConfigError,
          `expected ConcurrencyConfigError, got ${outcome.ok ? 'a slot' : describe(outcome.error)}`,
        );
        assert.equal((outcome.error as ConcurrencyError).limiter, limiter.name);
      }),
    },
  ];
  for (const c of fairnessConformanceCases()) cases.push({ name: c.name, run: withLimiters(c.run) });
  if (options.budgets) {
    for (const c of capacityConformanceCases(short)) cases.push({ name: c.name, run: withLimiters(c.run) });
  }
  return cases;
}
