import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  IMPLICIT_KEY,
  MAX_KEY_LENGTH,
  limiterErrors,
  optionError,
  prepareAcquire,
  resolveLimiterOptions,
  statsOf,
} from 'sluice/concurrency';

const limits = resolveLimiterOptions({
  name: 'claude',
  maxConcurrent: 4,
  maxQueued: 10,
  workloads: { interactive: { maxWaitMs: 1000 }, background: {} },
  defaultWorkload: 'background',
});
const lineage = { runId: 'r1', rootRunId: 'root', parentRunId: 'p', requestId: 'q1' };

describe('prepareAcquire', () => {
  it('gives the workload and the smaller of maxWaitMs and the budget', () => {
    const cases = [
      { request: { workload: 'interactive' as const }, timeoutMs: 1000 },
      { request: { workload: 'interactive' as const, timeoutMs: 400 }, timeoutMs: 400 },
      { request: { workload: 'interactive' as const, timeoutMs: 5000 }, timeoutMs: 1000 },
      { request: {}, timeoutMs: undefined },
      { request: { timeoutMs: 250 }, timeoutMs: 250 },
    ];
    for (const { request, timeoutMs } of cases) {
      const prepared = prepareAcquire(limits, request);
      expect(prepared).toEqual({
        ok: true,
        workload: limits.workloads.find((w) => w.name === (request.workload ?? 'background')),
        key: IMPLICIT_KEY,
        timeoutMs,
        tokens: { input: 0, output: 0 },
      });
    }
  });

  it('passes a key through, and refuses a key that is not a string of 1 to 256 characters', () => {
    const ok = prepareAcquire(limits, { key: 'tenant-a' });
    expect(ok).toMatchObject({ ok: true, key: 'tenant-a' });
    expect(prepareAcquire(limits, { key: 'x'.repeat(MAX_KEY_LENGTH) })).toMatchObject({ ok: true });
    const bad: [unknown, string][] = [
      ['', 'got `""`'],
      [42, 'got `42`'],
      [null, 'got `null`'],
      ['x'.repeat(MAX_KEY_LENGTH + 1), `got a string of ${MAX_KEY_LENGTH + 1} characters`],
    ];
    for (const [key, got] of bad) {
      const prepared = prepareAcquire(limits, { key: key as string, workload: 'interactive', ...lineage });
      expect(prepared.ok).toBe(false);
      const error = (prepared as { error: Error }).error;
      expect(error).toBeInstanceOf(ConcurrencyConfigError);
      expect(error).toMatchObject({
        limiter: 'claude',
        workload: 'interactive',
        field: 'key',
        value: key,
        ...lineage,
      });
      expect(error.message).toContain('Expected `key` to be a string of 1 to 256 characters');
      expect(error.message).toContain(got);
    }
  });

  it('refuses an unknown workload with the request lineage on the error', () => {
    const prepared = prepareAcquire(limits, { workload: 'batch' as never, ...lineage });
    expect(prepared.ok).toBe(false);
    const error = (prepared as { error: unknown }).error;
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    expect(error).toMatchObject({ limiter: 'claude', workload: 'batch', field: 'workload', ...lineage });
  });

  it('rejects an aborted signal with its reason, before looking at the budget', () => {
    const reason = new Error('gone');
    const prepared = prepareAcquire(limits, { signal: AbortSignal.abort(reason), timeoutMs: 0 });
    expect(prepared).toEqual({ ok: false, error: reason });
  });

  it.each([0, -5])('a budget of %i fails at once with a timeout that waited 0 ms', (timeoutMs) => {
    const prepared = prepareAcquire(limits, { workload: 'interactive', timeoutMs, ...lineage });
    const error = (prepared as { error: unknown }).error;
    expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(error).toMatchObject({
      limiter: 'claude',
      workload: 'interactive',
      waitMs: 0,
      timeoutMs: 0,
      ...lineage,
    });
  });

  it('a workload whose maxWaitMs is 0 may still ask (for a free slot only)', () => {
    const quick = resolveLimiterOptions({ maxConcurrent: 1, workloads: { quick: { maxWaitMs: 0 } } });
    expect(prepareAcquire(quick, { timeoutMs: 100 })).toMatchObject({ ok: true, timeoutMs: 0 });
  });
});

describe('limiterErrors', () => {
  const errors = limiterErrors(limits);

  it('builds timeouts and queue-full errors with their numbers and lineage', () => {
    const timeout = errors.timeout('interactive', lineage, 120, 100);
    expect(timeout).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(timeout).toMatchObject({
      limiter: 'claude',
      workload: 'interactive',
      waitMs: 120,
      timeoutMs: 100,
      ...lineage,
    });
    expect(timeout.message).toBe(
      'No slot of limiter `claude` (workload `interactive`) within 100 ms; waited 120 ms',
    );
    const full = errors.queueFull('background', lineage, 10);
    expect(full).toBeInstanceOf(ConcurrencyQueueFullError);
    expect(full).toMatchObject({
      limiter: 'claude',
      workload: 'background',
      maxQueued: 10,
      queued: 10,
      ...lineage,
    });
  });

  it('wraps an unknown failure as ConcurrencyLimiterError, and keeps a ConcurrencyError as it is', () => {
    const cause = new Error('connect ECONNREFUSED 127.0.0.1:1');
    const failure = errors.failure(cause, 'background', lineage);
    expect(failure).toBeInstanceOf(ConcurrencyLimiterError);
    expect(failure.message).toBe('Limiter `claude` failed: connect ECONNREFUSED 127.0.0.1:1');
    expect(failure).toMatchObject({ limiter: 'claude', workload: 'background', cause, ...lineage });
    expect(errors.failure('plain text', undefined, {}).message).toBe('Limiter `claude` failed: plain text');
    const timeout = errors.timeout('interactive', {}, 1, 1);
    expect(errors.failure(timeout, 'background', lineage)).toBe(timeout);
  });
});

describe('statsOf', () => {
  it('adds up per-workload counts and names every workload', () => {
    expect(statsOf(limits, { active: [1, 3], queued: [0, 2] })).toEqual({
      active: 4,
      queued: 2,
      workloads: { interactive: { active: 1, queued: 0 }, background: { active: 3, queued: 2 } },
    });
    expect(statsOf(limits, { active: [], queued: [] })).toEqual({
      active: 0,
      queued: 0,
      workloads: { interactive: { active: 0, queued: 0 }, background: { active: 0, queued: 0 } },
    });
  });
});

describe('optionError', () => {
  it('writes the options message style, naming the field and the value', () => {
    const error = optionError('claude', 'pollIntervalMs', 'a whole number >= 1', 'fast');
    expect(error).toBeInstanceOf(ConcurrencyConfigError);
    expect(error.message).toBe('Expected `pollIntervalMs` to be a whole number >= 1, got `"fast"`');
    expect(error).toMatchObject({ limiter: 'claude', field: 'pollIntervalMs', value: 'fast' });
  });
});
