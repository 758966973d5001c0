/**
 * Conformance cases of fair queuing by key (the rule: allocate.ts). A limiter built on the
 * shared `allocate` and `startTag` passes them; one that serves a workload in plain arrival
 * order, or mixes up keys, fails the order checks. Part of `concurrencyConformanceCases`.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConcurrencyConfigError } from './errors.js';
import type { ConcurrencyLease, ConcurrencyLimiter } from './limiter.js';
import type { ConcurrencyLimiterOptions } from './options.js';

type AnyLimiter = ConcurrencyLimiter<string>;
type Make = (o: Omit<ConcurrencyLimiterOptions<string>, 'name'>) => Promise<AnyLimiter>;

export interface FairnessCase {
  readonly name: string;
  run(make: Make): Promise<void>;
}

/** A request to queue: its label (in the order log) and key (absent: no key). */
interface Queued {
  readonly label: string;
  readonly key?: string;
  readonly cancel?: boolean;
}

/**
 * Holds the one slot (as `holderKey`), queues `requests` one after the other (each really in
 * the queue before the next arrives), cancels those marked, then releases one slot at a time
 * and returns the labels in the order the slot went to them.
 */
async function servingOrderOf(
  limiter: AnyLimiter,
  holderKey: string | undefined,
  requests: readonly Queued[],
): Promise<string[]> {
  const order: string[] = [];
  const long = 10_000;
  const holder = await limiter.acquire({ key: holderKey, timeoutMs: long });
  const pending = new Map<number, Promise<readonly [number, ConcurrencyLease<string>]>>();
  const controllers: AbortController[] = [];
  let queued = 0;
  for (const [i, r] of requests.entries()) {
    const controller = new AbortController();
    controllers.push(controller);
    const p = limiter.acquire({ key: r.key, timeoutMs: long, signal: controller.signal });
    if (r.cancel) p.catch(() => undefined);
    else
      pending.set(
        i,
        p.then((lease) => (order.push(r.label), [i, lease] as const)),
      );
    await waitUntilQueued(limiter, ++queued);
  }
  for (const [i, r] of requests.entries()) if (r.cancel) controllers[i]!.abort(new Error('cancelled'));
  let current = holder;
  while (pending.size > 0) {
    await limiter.release(current);
    const [index, lease] = await Promise.race(pending.values());
    pending.delete(index);
    current = lease;
  }
  await limiter.release(current);
  return order;
}

export function fairnessConformanceCases(): FairnessCase[] {
  return [
    {
      name: 'keys take turns in a workload, each key first in, first out',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        // The holder (key a) had the latest grant, so a's queued requests start one tag later:
        // b and c, new to the queue, go first; then one request per key and tag.
        const order = await servingOrderOf(limiter, 'a', [
          { label: 'a1', key: 'a' },
          { label: 'a2', key: 'a' },
          { label: 'a3', key: 'a' },
          { label: 'b1', key: 'b' },
          { label: 'b2', key: 'b' },
          { label: 'c1', key: 'c' },
        ]);
        assert.deepEqual(order, ['b1', 'c1', 'a1', 'b2', 'a2', 'a3']);
      },
    },
    {
      name: 'requests without a key share one key and keep their arrival order',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        const order = await servingOrderOf(limiter, undefined, [
          { label: 'n1' },
          { label: 'n2' },
          { label: 'k1', key: 'k' },
          { label: 'n3' },
          { label: 'k2', key: 'k' },
        ]);
        assert.deepEqual(order, ['k1', 'n1', 'k2', 'n2', 'n3']);
      },
    },
    {
      name: "a cancelled request leaves its key's turn to the key's next request",
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        const order = await servingOrderOf(limiter, 'h', [
          { label: 'a1', key: 'a', cancel: true },
          { label: 'a2', key: 'a' },
          { label: 'b1', key: 'b' },
          { label: 'b2', key: 'b' },
        ]);
        // a2 keeps the tag it was given (1), level with b2: arrival decides.
        assert.deepEqual(order, ['b1', 'a2', 'b2']);
        const stats = await limiter.stats?.();
        if (stats) assert.equal(stats.queued, 0, 'no request may stay queued');
      },
    },
    {
      name: 'keys are fair within a workload and priority still ranks workloads',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1, workloads: { high: { priority: 10 }, low: {} } });
        const order: string[] = [];
        const long = 10_000;
        const holder = await limiter.acquire({ workload: 'low', timeoutMs: long });
        const labels = [
          ['low', 'x', 'l-x1'],
          ['low', 'y', 'l-y1'],
          ['high', 'x', 'h-x1'],
          ['high', 'x', 'h-x2'],
          ['high', 'y', 'h-y1'],
        ] as const;
        const pending = new Map<number, Promise<readonly [number, ConcurrencyLease<string>]>>();
        for (const [i, [workload, key, label]] of labels.entries()) {
          const p = limiter.acquire({ workload, key, timeoutMs: long });
          pending.set(
            i,
            p.then((lease) => (order.push(label), [i, lease] as const)),
          );
          await waitUntilQueued(limiter, i + 1);
        }
        let current = holder;
        while (pending.size > 0) {
          await limiter.release(current);
          const [index, lease] = await Promise.race(pending.values());
          pending.delete(index);
          current = lease;
        }
        await limiter.release(current);
        assert.deepEqual(order, ['h-x1', 'h-y1', 'h-x2', 'l-x1', 'l-y1']);
      },
    },
    {
      name: 'a key that is not a string of 1 to 256 characters is a ConcurrencyConfigError',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        for (const key of ['', 'k'.repeat(257), 7 as unknown as string]) {
          const outcome = await limiter.acquire({ key }).then(
            async (lease) => {
              await limiter.release(lease);
              return undefined;
            },
            (error: unknown) => error,
          );
          assert.ok(
            outcome instanceof ConcurrencyConfigError,
            `key ${String(key).slice(0, 20)}: expected ConcurrencyConfigError`,
          );
          assert.equal(outcome.field, 'key');
          assert.equal(outcome.limiter, limiter.name);
        }
      },
    },
  ];
}

/** Waits until the limiter reports `n` queued requests (a short pause without `stats`). */
export async function waitUntilQueued(limiter: AnyLimiter, n: number): Promise<void> {
  if (!limiter.stats) {
    await sleep(50);
    return;
  }
  for (let i = 0; i < 600; i++) {
    const stats = await limiter.stats();
    if (stats.queued >= n) return;
    await sleep(i < 10 ? 0 : 5);
  }
  assert.fail(`expected ${n} queued requests`);
}
