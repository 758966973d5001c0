import { describe, expect, it } from 'vitest';
import { createAgent, createConcurrencyLimiter, type ConcurrencyLimiter } from 'sluice';
import { acquireSlot } from 'sluice/concurrency';
import { SlotBook } from '../../src/ops/slots.js';

/** A limiter that keeps no stats: the book must count it from the slot events alone. */
function withoutStats(limiter: ConcurrencyLimiter<string>): ConcurrencyLimiter<string> {
  return {
    name: limiter.name,
    acquire: (request) => limiter.acquire(request),
    renew: (lease) => limiter.renew(lease),
    release: (lease) => limiter.release(lease),
  };
}

const model = { api: 'openai-completions' as const, provider: 'x', id: 'm', baseUrl: 'http://127.0.0.1:9' };

describe('SlotBook', () => {
  it('counts a limiter without stats from the real slot events: waits opened and closed, slots held and given back', async () => {
    const inner = createConcurrencyLimiter({ name: 'plain', maxConcurrent: 1 });
    const limiter = withoutStats(inner);
    const book = new SlotBook({
      agents: { a: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }) },
    });
    const onEvent = (event: Parameters<SlotBook['observe']>[0]) => book.observe(event);
    const figures = async () =>
      (await book.read()).map(({ active, queued, source }) => ({ active, queued, source }));

    // Not used yet, and no stats to ask: nothing to show.
    expect(await book.read()).toEqual([]);
    const first = await acquireSlot({ limiter, onEvent, requestId: 'r1' });
    expect(await figures()).toEqual([{ active: 1, queued: 0, source: 'events' }]);

    const cancel = new AbortController();
    const second = acquireSlot({ limiter, onEvent, requestId: 'r2', signal: cancel.signal });
    const third = acquireSlot({ limiter, onEvent, requestId: 'r3' });
    expect(await figures()).toEqual([{ active: 1, queued: 2, source: 'events' }]);
    cancel.abort(new Error('caller left'));
    await expect(second).rejects.toThrow('caller left');
    expect(await figures()).toEqual([{ active: 1, queued: 1, source: 'events' }]);

    // A spent budget fails before any wait: it closes no wait that was not opened.
    await expect(acquireSlot({ limiter, onEvent, requestId: 'r4', timeoutMs: 0 })).rejects.toThrow();
    expect(await figures()).toEqual([{ active: 1, queued: 1, source: 'events' }]);

    await first.release('completed');
    const held = await third;
    expect(await figures()).toEqual([{ active: 1, queued: 0, source: 'events' }]);
    await held.release('completed');
    await held.release('completed');
    expect(await figures()).toEqual([{ active: 0, queued: 0, source: 'events' }]);
  });

  it('asks a limiter with stats, listing its workloads from the start; one that fails is left out', async () => {
    const limiter = createConcurrencyLimiter({
      name: 'split',
      maxConcurrent: 2,
      workloads: { interactive: { reserved: 1 }, background: {} },
      defaultWorkload: 'interactive',
    });
    const broken: ConcurrencyLimiter<string> = {
      ...withoutStats(createConcurrencyLimiter({ name: 'broken', maxConcurrent: 1 })),
      stats: () => Promise.reject(new Error('database down')),
    };
    const book = new SlotBook({
      agents: {
        a: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
        b: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter: broken } }),
      },
    });
    const slot = await limiter.acquire({ workload: 'background' });
    expect(await book.read()).toEqual([
      { limiter: 'split', workload: 'background', active: 1, queued: 0, source: 'stats' },
      { limiter: 'split', workload: 'interactive', active: 0, queued: 0, source: 'stats' },
    ]);
    await limiter.release(slot);
  });
});
