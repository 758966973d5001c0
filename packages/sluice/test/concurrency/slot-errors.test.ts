import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLeaseLostError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  TurnError,
  acquireSlot,
} from 'sluice/concurrency';
import { common, faulty, lineage, setup } from './slot-fixture.js';

describe('lineage on errors a limiter throws', () => {
  it("is added to a copy of the same class; the limiter's error is left as it was", async () => {
    const { clock, limiter, events, onEvent } = setup();
    const thrown = new ConcurrencyQueueFullError({
      limiter: 'claude',
      workload: 'interactive',
      maxQueued: 0,
      queued: 0,
    });
    const error = await acquireSlot({
      limiter: faulty(limiter, { acquire: thrown }),
      workload: 'interactive',
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyQueueFullError);
    expect(error).not.toBe(thrown);
    expect(error).toMatchObject({
      ...common,
      maxQueued: 0,
      queued: 0,
      message: thrown.message,
      name: thrown.name,
    });
    expect((error as Error).stack).toBe(thrown.stack);
    expect(thrown).toMatchObject({ runId: undefined, requestId: undefined });
    expect(events.at(-1)).toEqual({ type: 'queue-full', ...common, at: 1_000_000, waitMs: 0 });
  });

  it('a limiter error that already has its lineage is passed on as it is', async () => {
    const { clock, limiter, onEvent } = setup();
    const thrown = new ConcurrencyQueueFullError({ ...common, maxQueued: 0, queued: 0 });
    const error = await acquireSlot({
      limiter: faulty(limiter, { acquire: thrown }),
      workload: 'interactive',
      clock,
      onEvent,
      ...lineage,
    }).catch((e: unknown) => e);
    expect(error).toBe(thrown);
  });
});

describe('error classes', () => {
  it.each([
    [
      'ConcurrencyTimeoutError',
      new ConcurrencyTimeoutError({ ...common, waitMs: 5, timeoutMs: 5 }),
      { waitMs: 5, timeoutMs: 5 },
    ],
    [
      'ConcurrencyQueueFullError',
      new ConcurrencyQueueFullError({ ...common, maxQueued: 3, queued: 3 }),
      { maxQueued: 3, queued: 3 },
    ],
    [
      'ConcurrencyLimiterError',
      new ConcurrencyLimiterError('db down', { ...common, cause: 'x' }),
      { cause: 'x' },
    ],
    [
      'ConcurrencyConfigError',
      new ConcurrencyConfigError('bad', { ...common, field: 'f', value: 1 }),
      { field: 'f', value: 1 },
    ],
    [
      'ConcurrencyLeaseLostError',
      new ConcurrencyLeaseLostError({ ...common, leaseId: 'l', holdMs: 9 }),
      { leaseId: 'l', holdMs: 9 },
    ],
    [
      'TurnError',
      new TurnError('HTTP 500', { ...common, status: 500, retryable: true }),
      { status: 500, retryable: true },
    ],
  ])('%s extends ConcurrencyError and carries its fields', (name, error, extra) => {
    expect(error).toBeInstanceOf(ConcurrencyError);
    expect(error).toBeInstanceOf(Error);
    expect(error.name).toBe(name);
    expect(error).toMatchObject({ ...common, ...extra });
  });

  it('messages carry the numbers', () => {
    expect(new ConcurrencyTimeoutError({ ...common, waitMs: 120, timeoutMs: 120 }).message).toBe(
      'No slot of limiter `claude` (workload `interactive`) within 120 ms; waited 120 ms',
    );
    expect(new ConcurrencyLeaseLostError({ ...common, leaseId: 'abc', holdMs: 31_000 }).message).toBe(
      'Lease `abc` of limiter `claude` was lost after 31000 ms; the request was aborted',
    );
  });
});
