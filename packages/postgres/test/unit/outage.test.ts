import { describe, expect, it } from 'vitest';
import { ManualClock } from 'sluice/concurrency';
import { OutageWatch } from '../../src/outage.js';

function deferred<T = void>() {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

describe('OutageWatch', () => {
  it('an answer within the grace ends the unanswered period, and nothing fires', async () => {
    const clock = new ManualClock();
    const outages: unknown[] = [];
    const watch = new OutageWatch(clock, 1000, (cause) => outages.push(cause));
    const op = deferred<number>();
    const result = watch.watch(() => op.promise);
    clock.advance(999);
    op.resolve(7);
    expect(await result).toBe(7);
    expect(clock.pendingTimers).toBe(0);
    clock.advance(5000);
    expect(outages).toEqual([]);
  });

  it('failures keep the period going; at the grace it fires once, with the last failure', async () => {
    const clock = new ManualClock();
    const outages: unknown[] = [];
    const watch = new OutageWatch(clock, 1000, (cause) => outages.push(cause));
    const refused = new Error('ECONNREFUSED');
    await expect(watch.watch(() => Promise.reject(new Error('first')))).rejects.toThrow('first');
    clock.advance(400);
    await expect(watch.watch(() => Promise.reject(refused))).rejects.toBe(refused);
    expect(watch.failure).toEqual({ error: refused });
    clock.advance(599);
    expect(outages).toEqual([]);
    clock.advance(1);
    expect(outages).toEqual([refused]);
    expect(watch.failure).toBeUndefined();
    expect(clock.pendingTimers).toBe(0);
  });

  it('a database that only hangs fires too, with an error that says so', () => {
    const clock = new ManualClock();
    const outages: unknown[] = [];
    const watch = new OutageWatch(clock, 250, (cause) => outages.push(cause));
    void watch.watch(() => new Promise(() => undefined));
    clock.advance(250);
    expect(outages).toHaveLength(1);
    expect((outages[0] as Error).message).toBe('the database did not answer within 250 ms');
  });

  it('a success after failures clears the failure', async () => {
    const clock = new ManualClock();
    const watch = new OutageWatch(clock, 1000, () => undefined);
    await watch.watch(() => Promise.reject(new Error('blip'))).catch(() => undefined);
    expect(watch.failure).toBeDefined();
    await watch.watch(() => Promise.resolve());
    expect(watch.failure).toBeUndefined();
    expect(clock.pendingTimers).toBe(0);
  });
});
