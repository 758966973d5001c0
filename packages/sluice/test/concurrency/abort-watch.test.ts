import { getEventListeners } from 'node:events';
import { describe, expect, it } from 'vitest';
import { AbortWatch, createConcurrencyLimiter } from 'sluice/concurrency';

describe('AbortWatch', () => {
  it('puts one listener on a signal for all its waiters and calls them in order on abort', () => {
    const called: string[] = [];
    const watch = new AbortWatch<string>((waiter, reason) => called.push(`${waiter}:${String(reason)}`));
    const controller = new AbortController();
    for (const waiter of ['a', 'b', 'c']) watch.watch(controller.signal, waiter);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    watch.unwatch(controller.signal, 'b');
    controller.abort('stop');
    expect(called).toEqual(['a:stop', 'c:stop']);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
    expect(watch.signals).toBe(0);
  });

  it('takes the listener off with the last waiter, and keeps signals apart', () => {
    const called: string[] = [];
    const watch = new AbortWatch<string>((waiter) => called.push(waiter));
    const one = new AbortController();
    const two = new AbortController();
    watch.watch(one.signal, 'a');
    watch.watch(two.signal, 'b');
    watch.unwatch(one.signal, 'a');
    // Unwatching what is not watched changes nothing.
    watch.unwatch(one.signal, 'a');
    watch.unwatch(two.signal, 'a');
    expect(getEventListeners(one.signal, 'abort')).toHaveLength(0);
    expect(getEventListeners(two.signal, 'abort')).toHaveLength(1);
    one.abort();
    two.abort();
    expect(called).toEqual(['b']);
  });

  it('a waiter unwatched by an earlier one’s callback during the abort is not called', () => {
    // As with separate listeners: one taken off during the dispatch does not run.
    const called: string[] = [];
    const controller = new AbortController();
    const watch: AbortWatch<string> = new AbortWatch<string>((waiter) => {
      called.push(waiter);
      watch.unwatch(controller.signal, waiter);
      if (waiter === 'a') watch.unwatch(controller.signal, 'b');
    });
    for (const waiter of ['a', 'b', 'c']) watch.watch(controller.signal, waiter);
    controller.abort();
    expect(called).toEqual(['a', 'c']);
    expect(watch.signals).toBe(0);
  });
});

describe('the limiter with a shared signal', () => {
  it('200 requests waiting on one signal make Node print no warning', async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error) => warnings.push(warning.name);
    process.on('warning', onWarning);
    try {
      const limiter = createConcurrencyLimiter({ name: 'shared-signal', maxConcurrent: 1, maxQueued: 1_000 });
      const holder = await limiter.acquire();
      const controller = new AbortController();
      const waiting = Array.from({ length: 200 }, () =>
        limiter.acquire({ signal: controller.signal }).then(
          () => 'granted',
          (error: unknown) => (error === controller.signal.reason ? 'rejected' : 'other'),
        ),
      );
      controller.abort(new Error('cancelled'));
      expect(new Set(await Promise.all(waiting))).toEqual(new Set(['rejected']));
      await limiter.release(holder);
      // process.emitWarning reports on the next tick.
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).not.toContain('MaxListenersExceededWarning');
    } finally {
      process.off('warning', onWarning);
    }
  });
});
