import { describe, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { ManualClock, systemClock } from 'sluice/concurrency';
import { agentDefaults } from '../../src/agent/defaults.js';
import { resolveRuntimeOptions, type RuntimeOptions } from '../../src/agent/options.js';

const model = {
  api: 'openai-completions' as const,
  provider: 'x',
  id: 'y',
  baseUrl: 'http://127.0.0.1:9/v1',
};

describe('agent options', () => {
  it('fills every default from one object, and freezes the result', () => {
    const resolved = resolveRuntimeOptions({});
    expect(resolved).toEqual({
      bounds: { maxParallelToolCalls: 10, toolTimeoutMs: undefined, turnTimeoutMs: undefined },
      retry: { maxRetries: 3, baseDelayMs: 500, maxDelayMs: 30_000 },
      maxRepairs: 2,
      compaction: { maxChars: undefined, keepLast: 6 },
      clock: systemClock,
    });
    expect(resolved.retry).toEqual(agentDefaults.retry);
    expect(
      Object.isFrozen(resolved) && Object.isFrozen(resolved.retry) && Object.isFrozen(resolved.bounds),
    ).toBe(true);
  });

  it('keeps what was given', () => {
    const clock = new ManualClock();
    expect(
      resolveRuntimeOptions({
        bounds: { maxParallelToolCalls: 2, toolTimeoutMs: 1000, turnTimeoutMs: 2000 },
        retry: { maxRetries: 0, baseDelayMs: 0, maxDelayMs: 100 },
        maxRepairs: 0,
        compaction: { maxChars: 5000, keepLast: 0 },
        clock,
      }),
    ).toEqual({
      bounds: { maxParallelToolCalls: 2, toolTimeoutMs: 1000, turnTimeoutMs: 2000 },
      retry: { maxRetries: 0, baseDelayMs: 0, maxDelayMs: 100 },
      maxRepairs: 0,
      compaction: { maxChars: 5000, keepLast: 0 },
      clock,
    });
  });

  it.each<[RuntimeOptions, string]>([
    [{ retry: { maxRetries: -1 } }, 'Expected `retry.maxRetries` to be a whole number >= 0, got `-1`'],
    [{ retry: { maxRetries: 1.5 } }, 'Expected `retry.maxRetries` to be a whole number >= 0, got `1.5`'],
    [
      { retry: { baseDelayMs: -1 } },
      'Expected `retry.baseDelayMs` to be a number of ms >= 0 and at most 2147483647, got `-1`',
    ],
    [
      { retry: { maxDelayMs: 3e9 } },
      'Expected `retry.maxDelayMs` to be a number of ms >= 0 and at most 2147483647, got `3000000000`',
    ],
    [
      { retry: { maxDelay: 5 } as never },
      'Expected `retry.maxDelay` to be one of maxRetries, baseDelayMs, maxDelayMs (misspelt?), got `"maxDelay"`',
    ],
    [{ retry: 3 as never }, 'Expected `retry` to be an object, got `3`'],
    [{ maxRepairs: -1 }, 'Expected `maxRepairs` to be a whole number >= 0, got `-1`'],
    [{ maxRepairs: '2' as never }, 'Expected `maxRepairs` to be a whole number >= 0, got `"2"`'],
    [{ compaction: { maxChars: 0 } }, 'Expected `compaction.maxChars` to be a whole number >= 1, got `0`'],
    [{ compaction: { keepLast: -2 } }, 'Expected `compaction.keepLast` to be a whole number >= 0, got `-2`'],
    [
      { compaction: { keep: 2 } as never },
      'Expected `compaction.keep` to be one of maxChars, keepLast (misspelt?), got `"keep"`',
    ],
    [
      { bounds: { maxParallelToolCalls: 0 } },
      'Expected `bounds.maxParallelToolCalls` to be a whole number >= 1, got `0`',
    ],
    [
      { bounds: { turnTimeoutMs: 0 } },
      'Expected `bounds.turnTimeoutMs` to be a number of ms > 0 and at most 2147483647, got `0`',
    ],
    [
      { bounds: { toolTimeoutMs: Infinity } },
      'Expected `bounds.toolTimeoutMs` to be a number of ms > 0 and at most 2147483647, got `Infinity`',
    ],
    [{ clock: { now: () => 0 } as never }, 'Expected `clock.setTimeout` to be a function, got `undefined`'],
    [{ clock: 'wall' as never }, 'Expected `clock` to be a Clock, got `"wall"`'],
  ])('refuses %j', (options, message) => {
    expect(() => resolveRuntimeOptions(options)).toThrow(new TypeError(message));
    // createAgent validates the same way, before anything runs.
    expect(() => createAgent({ model, ...options })).toThrow(message);
  });

  it('a run refuses a timeoutMs no timer can wait, naming it', async () => {
    const agent = createAgent({ model, credentials: { apiKey: 'k' } });
    await expect(agent.run({ prompt: 'hi', timeoutMs: -1 })).rejects.toThrow(
      'Expected `timeoutMs` to be a number of ms >= 0 and at most 2147483647, got `-1`',
    );
    await expect(agent.run({ prompt: 'hi', timeoutMs: NaN })).rejects.toThrow('got `NaN`');
  });
});
