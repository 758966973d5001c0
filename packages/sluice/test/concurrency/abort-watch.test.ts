import { getEventListeners } from 'node:events';
import { describe, expect, it, vi } from 'vitest';
import { AbortWatch, acquireSlot, createConcurrencyLimiter } from 'sluice/concurrency';

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

describe('AbortWatch, its edges', () => {
  it('calls afterAbort once, after every waiter of the signal', () => {
    const log: string[] = [];
    const watch = new AbortWatch<string>(
      (waiter) => log.push(waiter),
      () => log.push('after'),
    );
    const controller = new AbortController();
    watch.watch(controller.signal, 'a');
    watch.watch(controller.signal, 'b');
    controller.abort();
    expect(log).toEqual(['a', 'b', 'after']);
  });

  it('a callback that throws stops neither the others nor the cleanup, and is thrown again', () => {
    const thrown: (() => void)[] = [];
    const microtasks = vi
      .spyOn(globalThis, 'queueMicrotask')
      .mockImplementation((task) => void thrown.push(task));
    try {
      const called: string[] = [];
      const watch = new AbortWatch<string>((waiter) => {
        called.push(waiter);
        if (waiter === 'a') throw new Error('onAbort failed for a');
      });
      const controller = new AbortController();
      for (const waiter of ['a', 'b', 'c']) watch.watch(controller.signal, waiter);
      controller.abort();
      expect(called).toEqual(['a', 'b', 'c']);
      expect(watch.signals).toBe(0);
      expect(thrown).toHaveLength(1);
      expect(() => thrown[0]!()).toThrow('onAbort failed for a');
    } finally {
      microtasks.mockRestore();
    }
  });

  it('refuses a signal that has already aborted (it would never fire)', () => {
    const watch = new AbortWatch<string>(() => undefined);
    expect(() => watch.watch(AbortSignal.abort(), 'a')).toThrow(TypeError);
    expect(watch.signals).toBe(0);
  });

  it('keeps nothing once waiters on many signals have left', () => {
    const watch = new AbortWatch<number>(() => undefined);
    const controllers = Array.from({ length: 100 }, () => new AbortController());
    controllers.forEach((c, i) => {
      watch.watch(c.signal, i);
      if (i % 2) watch.watch(c.signal, i + 1000);
    });
    expect(watch.signals).toBe(100);
    controllers.forEach((c, i) => {
      if (i % 3 === 0) c.abort();
      else {
        watch.unwatch(c.signal, i);
        watch.unwatch(c.signal, i + 1000);
      }
    });
    expect(watch.signals).toBe(0);
    expect(controllers.every((c) => getEventListeners(c.signal, 'abort').length === 0)).toBe(true);
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

describe('a shared signal through the other paths', () => {
  it('acquireSlot with a time budget: 12 waits on one signal put one listener on it', async () => {
    const limiter = createConcurrencyLimiter({ name: 'slots-shared-signal', maxConcurrent: 1 });
    const holder = await limiter.acquire();
    const controller = new AbortController();
    const waits = Array.from({ length: 12 }, () =>
      acquireSlot({ limiter, signal: controller.signal, timeoutMs: 60_000 }).then(
        () => 'granted',
        (error: unknown) => (error === controller.signal.reason ? 'cancelled' : String(error)),
      ),
    );
    await vi.waitFor(() => expect(limiter.stats().queued).toBe(12));
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    controller.abort(new Error('the run was cancelled'));
    expect(new Set(await Promise.all(waits))).toEqual(new Set(['cancelled']));
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
    await limiter.release(holder);
  });

  it('a request whose options object changes after it asked leaves nothing on its signal', async () => {
    const limiter = createConcurrencyLimiter({ name: 'changed-request', maxConcurrent: 1 });
    const holder = await limiter.acquire();
    const controller = new AbortController();
    const request: { signal?: AbortSignal } = { signal: controller.signal };
    const waiting = limiter.acquire(request);
    // The caller reuses its options object for something else while the request waits.
    request.signal = undefined;
    await limiter.release(holder);
    await limiter.release(await waiting);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
  });

  it('with token budgets, the abort of a head waiter grants nothing to a later waiter of the same signal', async () => {
    const limiter = createConcurrencyLimiter({
      name: 'budget-abort',
      maxConcurrent: 10,
      rate: { tokensPerMinute: 1_000 },
    });
    const first = await limiter.acquire({ tokens: { input: 900 } });
    const controller = new AbortController();
    const outcome = (p: Promise<unknown>) =>
      p.then(
        () => 'granted',
        () => 'rejected',
      );
    // The head waits for the budget; the small one fits but waits behind it.
    const head = outcome(limiter.acquire({ signal: controller.signal, tokens: { input: 800 } }));
    const small = outcome(limiter.acquire({ signal: controller.signal, tokens: { input: 50 } }));
    expect(limiter.stats().queued).toBe(2);
    controller.abort(new Error('cancelled'));
    expect(await Promise.all([head, small])).toEqual(['rejected', 'rejected']);
    await limiter.release(first);
  });
});
