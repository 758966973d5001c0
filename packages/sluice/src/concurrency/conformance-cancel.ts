/**
 * Conformance cases of cancellation: a caller's AbortSignal ends its wait with its reason, a
 * signal shared by many waiting requests, and an abort at the moment of a grant.
 */
import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import type { ConcurrencyLimiter } from './limiter.js';
import type { ConcurrencyLimiterOptions } from './options.js';
import { waitUntilQueued } from './conformance-fairness.js';
import { describe, settle } from './conformance-support.js';

type AnyLimiter = ConcurrencyLimiter<string>;
type Make = (o: Omit<ConcurrencyLimiterOptions<string>, 'name'>) => Promise<AnyLimiter>;

export interface CancelCase {
  readonly name: string;
  /** `expectTimeout`: the suite's check that a request gets no slot within its short wait. */
  run(make: Make, expectTimeout: (limiter: AnyLimiter) => Promise<void>): Promise<void>;
}

// A wait long enough that a request expected to succeed does; not a timing assertion.
const long = 10_000;

export function cancelConformanceCases(): CancelCase[] {
  return [
    {
      name: 'an aborted signal removes the waiter and rejects with its reason',
      run: async (make, expectTimeout) => {
        const limiter = await make({ maxConcurrent: 1 });
        const a = await limiter.acquire();
        const controller = new AbortController();
        const waiting = settle(limiter.acquire({ signal: controller.signal, timeoutMs: long }));
        await waitUntilQueued(limiter, 1);
        const reason = new Error('caller gave up');
        controller.abort(reason);
        const outcome = await waiting;
        if (outcome.ok) await limiter.release(outcome.value);
        assert.ok(!outcome.ok && outcome.error === reason, 'acquire must reject with signal.reason');
        await limiter.release(a);
        // The slot comes to the next caller, not to the cancelled request.
        const c = await limiter.acquire({ timeoutMs: long });
        await expectTimeout(limiter);
        await limiter.release(c);
        const already = await settle(limiter.acquire({ signal: AbortSignal.abort(reason) }));
        assert.ok(!already.ok && already.error === reason, 'an already aborted signal must reject at once');
        const stats = await limiter.stats?.();
        if (stats) assert.equal(stats.queued, 0, 'no request may stay queued after cancellation');
      },
    },
    {
      name: 'a signal shared by many waiting requests: no listener warning, all rejected, nothing left on it',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        const holder = await limiter.acquire();
        const listeners = (signal: AbortSignal) => getEventListeners(signal, 'abort').length;
        // Aborted while all wait: each rejects with the reason, and the signal is left bare.
        const controller = new AbortController();
        const waiting = Array.from({ length: 12 }, () =>
          settle(limiter.acquire({ signal: controller.signal, timeoutMs: long })),
        );
        await waitUntilQueued(limiter, 12);
        assert.ok(
          listeners(controller.signal) <= 10,
          `12 requests waiting on one signal put ${listeners(controller.signal)} listeners on it: past 10, Node warns of a leak`,
        );
        const reason = new Error('the batch was cancelled');
        controller.abort(reason);
        for (const outcome of await Promise.all(waiting)) {
          if (outcome.ok) await limiter.release(outcome.value);
          assert.ok(!outcome.ok && outcome.error === reason, 'each must reject with signal.reason');
        }
        assert.equal(
          listeners(controller.signal),
          0,
          'an aborted request must leave no listener on the signal',
        );
        // Granted one after another: the signal holds nothing once the last is granted.
        const kept = new AbortController();
        const granted = Array.from({ length: 12 }, () =>
          limiter.acquire({ signal: kept.signal, timeoutMs: long }),
        );
        await waitUntilQueued(limiter, 12);
        let current = holder;
        for (const next of granted) {
          await limiter.release(current);
          current = await next;
        }
        assert.equal(listeners(kept.signal), 0, 'a granted request must take its listener off the signal');
        await limiter.release(current);
        const stats = await limiter.stats?.();
        if (stats) assert.equal(stats.queued, 0, 'no request may stay queued');
      },
    },
    {
      name: 'cancelling at the moment of a grant never leaks a slot',
      run: async (make) => {
        const limiter = await make({ maxConcurrent: 1 });
        for (let round = 0; round < 12; round++) {
          const holder = await limiter.acquire({ timeoutMs: long });
          const controller = new AbortController();
          const waiting = settle(limiter.acquire({ signal: controller.signal, timeoutMs: long }));
          await waitUntilQueued(limiter, 1);
          // Both in the same tick, in both orders.
          if (round % 2) {
            controller.abort(new Error('cancelled'));
            void limiter.release(holder);
          } else {
            void limiter.release(holder);
            controller.abort(new Error('cancelled'));
          }
          const outcome = await waiting;
          if (outcome.ok) await limiter.release(outcome.value);
          const next = await settle(limiter.acquire({ timeoutMs: long }));
          assert.ok(next.ok, `round ${round}: the slot leaked: ${next.ok ? '' : describe(next.error)}`);
          await limiter.release(next.value);
        }
      },
    },
  ];
}
