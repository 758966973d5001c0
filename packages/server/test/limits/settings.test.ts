import { describe, expect, it } from 'vitest';
import { SettingsError, resolveSettings, settingDefaults } from '@sluice/server';
import { threadLeaseMs } from '../../src/threads/store.js';

/** The error `resolveSettings` throws for these inputs (the test fails when it throws none). */
function refusal(fromConfig: Record<string, unknown>, env: NodeJS.ProcessEnv = {}): SettingsError {
  try {
    resolveSettings(fromConfig, env);
  } catch (error) {
    expect(error).toBeInstanceOf(SettingsError);
    return error as SettingsError;
  }
  throw new Error(`accepted ${JSON.stringify({ fromConfig, env })}`);
}

const MAX_TIMER_MS = 2 ** 31 - 1;

describe('L5: settings out of range are refused, naming the variable, the range and the value', () => {
  // Each row: the variable, its settings key, a value past its range, and the range's bounds.
  it.each([
    ['AGENT_SYNC_TIMEOUT_MS', 'syncTimeoutMs', '3000000000', 1, MAX_TIMER_MS],
    ['SLUICE_NODE_STALE_MS', 'nodeStaleMs', '10000000000', 100, MAX_TIMER_MS],
    ['AGENT_BACKGROUND_MAX_DURATION_MS', 'maxDurationMs', String(MAX_TIMER_MS + 1), 1, MAX_TIMER_MS],
    ['AGENT_RUN_DRAIN_TIMEOUT_MS', 'drainTimeoutMs', '-1', 0, MAX_TIMER_MS],
    ['SLUICE_DB_STATEMENT_TIMEOUT_MS', 'statementTimeoutMs', '99', 100, MAX_TIMER_MS],
    ['AGENT_RUN_CONCURRENCY', 'runConcurrency', '1000000', 1, 1000],
    ['AGENT_DEFERRED_CONCURRENCY', 'deferredConcurrency', '0', 1, 1000],
    [
      'AGENT_DEFERRED_MAX_WAIT_MS',
      'deferredMaxWaitMs',
      String(366 * 24 * 3_600_000),
      1,
      365 * 24 * 3_600_000,
    ],
    ['SLUICE_DB_POOL_SIZE', 'poolSize', '1', 2, 1000],
    ['SLUICE_MAX_CONNECTIONS', 'maxConnections', '0', 1, 1_000_000],
    ['SLUICE_REQUEST_TIMEOUT_MS', 'requestTimeoutMs', '999', 1000, 600_000],
    ['SLUICE_REQUEST_TIMEOUT_MS', 'requestTimeoutMs', '600001', 1000, 600_000],
    ['AGENT_RUN_MAX_ACTIVE_PER_TENANT', 'maxActivePerTenant', '1000001', 0, 1_000_000],
  ])('%s=%s', (variable, key, value, min, max) => {
    for (const error of [refusal({}, { [variable]: value }), refusal({ [key]: Number(value) })]) {
      expect(error.variable).toBe(variable);
      expect(error.message).toContain(variable);
      expect(error.message).toContain(`settings.${key}`);
      expect(error.message).toContain(`from ${min} to ${max}`);
      expect(error.message).toContain(value);
    }
  });

  it('SLUICE_DB_PREPARED_STATEMENTS: on unless 0, and anything but 1 or 0 is refused, named', () => {
    expect(resolveSettings({}, {}).preparedStatements).toBe(true);
    expect(resolveSettings({}, { SLUICE_DB_PREPARED_STATEMENTS: '0' }).preparedStatements).toBe(false);
    expect(resolveSettings({ preparedStatements: false }, {}).preparedStatements).toBe(false);
    const error = refusal({}, { SLUICE_DB_PREPARED_STATEMENTS: 'yes' });
    expect(error.variable).toBe('SLUICE_DB_PREPARED_STATEMENTS');
    expect(error.message).toContain('settings.preparedStatements');
    expect(error.message).toContain('`yes`');
  });

  it('values that are not whole numbers are refused the same way', () => {
    for (const value of ['10s', '1.5', '1e3', 'Infinity', '0x10', 'ten']) {
      const error = refusal({}, { AGENT_SYNC_TIMEOUT_MS: value });
      expect(error.variable).toBe('AGENT_SYNC_TIMEOUT_MS');
      expect(error.message).toContain(`whole number from 1 to ${MAX_TIMER_MS}, got \`${value}\``);
    }
    expect(refusal({ syncTimeoutMs: 1.5 }).value).toBe(1.5);
    expect(refusal({ syncTimeoutMs: true }).message).toContain('got `true`');
  });

  it('the environment overrides the config file, and the bounds themselves are accepted', () => {
    expect(settingDefaults.requestTimeoutMs).toBe(30_000);
    const settings = resolveSettings(
      { syncTimeoutMs: 5, requestTimeoutMs: 1000 },
      { AGENT_SYNC_TIMEOUT_MS: String(MAX_TIMER_MS), SLUICE_REQUEST_TIMEOUT_MS: '600000' },
    );
    expect(settings.syncTimeoutMs).toBe(MAX_TIMER_MS);
    expect(settings.requestTimeoutMs).toBe(600_000);
    expect(resolveSettings({ requestTimeoutMs: 1000 }, {}).requestTimeoutMs).toBe(1000);
    expect(Object.isFrozen(settings)).toBe(true);
  });
});

describe('the bounds of held runs (runs.* in the config, SLUICE_* variables)', () => {
  it('defaults: no run timeout while developing, 300 s with NODE_ENV=production; 10 held runs per user; 10 parallel tool calls; 30 s thread wait', () => {
    expect(resolveSettings({}, {})).toMatchObject({
      runTimeoutMs: null,
      maxConcurrentPerUser: 10,
      maxParallelToolCalls: 10,
      threadBusyWaitMs: 30_000,
    });
    expect(resolveSettings({}, { NODE_ENV: 'production' }).runTimeoutMs).toBe(300_000);
  });

  it("MODE, the spec's name, gives the 300 s timeout too, and decides over NODE_ENV when set", () => {
    expect(resolveSettings({}, { MODE: 'production' }).runTimeoutMs).toBe(300_000);
    expect(resolveSettings({}, { MODE: 'development' }).runTimeoutMs).toBeNull();
    // An image that sets NODE_ENV=production can still be run open for debugging.
    expect(resolveSettings({}, { MODE: 'development', NODE_ENV: 'production' }).runTimeoutMs).toBeNull();
    expect(resolveSettings({}, { MODE: 'production', NODE_ENV: 'test' }).runTimeoutMs).toBe(300_000);
    expect(resolveSettings({}, { MODE: '', NODE_ENV: 'production' }).runTimeoutMs).toBe(300_000);
    // An explicit timeout wins over either mode.
    expect(resolveSettings({}, { MODE: 'production' }, { timeoutMs: null }).runTimeoutMs).toBeNull();
    expect(resolveSettings({}, { MODE: 'production', SLUICE_RUN_TIMEOUT_MS: '7' }).runTimeoutMs).toBe(7);
  });

  it('a MODE other than production or development is refused, naming MODE and the value', () => {
    // `prod`, a capital, or vitest's own `test`: each would silently have meant "no timeout".
    for (const mode of ['prod', 'Production', 'test', 'staging ']) {
      const error = refusal({}, { MODE: mode });
      expect(error.variable).toBe('MODE');
      expect(error.value).toBe(mode);
      expect(error.message).toContain('MODE');
      expect(error.message).toContain('production or development');
      expect(error.message).toContain(`\`${mode}\``);
    }
  });

  it('the runs block sets them; null removes the timeout and the user cap, even in production', () => {
    const runs = {
      timeoutMs: 5_000,
      maxConcurrentPerUser: 3,
      maxParallelToolCalls: 4,
      threadBusyWaitMs: 100,
    };
    expect(resolveSettings({}, {}, runs)).toMatchObject({
      runTimeoutMs: 5_000,
      maxConcurrentPerUser: 3,
      maxParallelToolCalls: 4,
      threadBusyWaitMs: 100,
    });
    const open = resolveSettings(
      {},
      { NODE_ENV: 'production' },
      { timeoutMs: null, maxConcurrentPerUser: null },
    );
    expect(open.runTimeoutMs).toBeNull();
    expect(open.maxConcurrentPerUser).toBe(0);
  });

  it('environment variables override the runs block; SLUICE_RUN_TIMEOUT_MS=none removes the timeout', () => {
    const env = {
      NODE_ENV: 'production',
      SLUICE_RUN_TIMEOUT_MS: 'none',
      SLUICE_MAX_CONCURRENT_PER_USER: '0',
      SLUICE_MAX_PARALLEL_TOOL_CALLS: '2',
      SLUICE_THREAD_BUSY_WAIT_MS: '250',
    };
    expect(
      resolveSettings({}, env, { timeoutMs: 1, maxConcurrentPerUser: 5, maxParallelToolCalls: 9 }),
    ).toMatchObject({
      runTimeoutMs: null,
      maxConcurrentPerUser: 0,
      maxParallelToolCalls: 2,
      threadBusyWaitMs: 250,
    });
    expect(resolveSettings({}, { SLUICE_RUN_TIMEOUT_MS: '1500' }).runTimeoutMs).toBe(1500);
  });

  it('bad values are refused naming the variable, the config key and the value', () => {
    for (const value of ['-5', '1.5', 'forever', String(MAX_TIMER_MS + 1)]) {
      const error = refusal({}, { SLUICE_RUN_TIMEOUT_MS: value });
      expect(error.variable).toBe('SLUICE_RUN_TIMEOUT_MS');
      expect(error.message).toContain('runs.timeoutMs');
      expect(error.message).toContain(value);
    }
    expect(() => resolveSettings({}, {}, { maxParallelToolCalls: 0 })).toThrow(
      /SLUICE_MAX_PARALLEL_TOOL_CALLS \(runs\.maxParallelToolCalls\) to be a whole number from 1 to 10000, got `0`/,
    );
    expect(() => resolveSettings({}, { SLUICE_THREAD_BUSY_WAIT_MS: 'soon' })).toThrow(
      /runs\.threadBusyWaitMs/,
    );
  });
});

describe('the defaults the spec gives, with nothing set', () => {
  const defaults = resolveSettings({}, {});

  it('the run classes: 250 active per tenant, no project cap, 4 workers, 2 deferred running and 10,000 queued per tenant', () => {
    expect(defaults).toMatchObject({
      maxActivePerTenant: 250,
      maxActivePerProject: 0,
      runConcurrency: 4,
      deferredMaxRunningPerTenant: 2,
      deferredMaxQueuedPerTenant: 10_000,
    });
  });

  it('the times: 24 h deferred wait, 30 min run ceiling, 10 min wait window, 10 s drain', () => {
    expect(defaults).toMatchObject({
      deferredMaxWaitMs: 24 * 3_600_000,
      maxDurationMs: 30 * 60_000,
      syncTimeoutMs: 10 * 60_000,
      drainTimeoutMs: 10_000,
    });
  });

  it('deferred workers: half the default workers, rounded down, at least 1, unless set', () => {
    expect(defaults.deferredConcurrency).toBe(2);
    const workers = (runConcurrency: string, extra: NodeJS.ProcessEnv = {}) =>
      resolveSettings({}, { AGENT_RUN_CONCURRENCY: runConcurrency, ...extra }).deferredConcurrency;
    expect([workers('1'), workers('2'), workers('3'), workers('9'), workers('1000')]).toEqual([
      1, 1, 1, 4, 500,
    ]);
    expect(workers('1', { AGENT_DEFERRED_CONCURRENCY: '7' })).toBe(7);
    expect(resolveSettings({ runConcurrency: 6 }, {}).deferredConcurrency).toBe(3);
  });

  it('a thread lease of 60 s: three times the 20 s after which a silent process is gone', () => {
    expect(defaults.nodeStaleMs).toBe(20_000);
    expect(threadLeaseMs(defaults)).toBe(60_000);
  });

  it('0 is no cap for the tenant and project caps, and is accepted for them', () => {
    expect(resolveSettings({}, { AGENT_RUN_MAX_ACTIVE_PER_TENANT: '0' }).maxActivePerTenant).toBe(0);
    expect(resolveSettings({}, { AGENT_RUN_MAX_ACTIVE_PER_PROJECT: '0' }).maxActivePerProject).toBe(0);
    // What the 0 does over HTTP: ../limits/zero-caps.test.ts.
  });
});
