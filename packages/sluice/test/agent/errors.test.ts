import { describe, expect, it } from 'vitest';
import { ConcurrencyError, RepairLimitError, RunTimeoutError } from 'sluice';

const fields = {
  limiter: 'claude',
  workload: 'interactive',
  runId: 'run-2',
  rootRunId: 'run-1',
  parentRunId: 'run-1',
};

describe('the agent runtime errors', () => {
  it.each([
    [
      'RunTimeoutError',
      new RunTimeoutError({ ...fields, timeoutMs: 5000 }),
      { timeoutMs: 5000, requestId: undefined },
      'Run run-2 passed its time budget of 5000 ms',
    ],
    [
      'RepairLimitError',
      new RepairLimitError({ ...fields, requestId: 'req-9', repairs: 2, lastProblem: 'unknown tool `x`' }),
      { repairs: 2, lastProblem: 'unknown tool `x`', requestId: 'req-9' },
      'Run run-2 gave up after 2 corrective turns: unknown tool `x`',
    ],
  ])('%s is named as its class and carries the fields of the core errors', (name, error, extra, message) => {
    expect(error).toBeInstanceOf(Error);
    // Not a limiter failure: code that catches ConcurrencyError must not catch these.
    expect(error).not.toBeInstanceOf(ConcurrencyError);
    expect(error.name).toBe(name);
    expect(error.message).toBe(message);
    expect(error).toMatchObject({ ...fields, ...extra });
  });
});
