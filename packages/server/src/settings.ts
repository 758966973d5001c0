/** The server's settings, under the spec's names; environment variables override the config file. */
export interface ServerSettings {
  /** AGENT_RUN_MAX_ACTIVE_PER_TENANT: default-class queued + running runs per tenant; 0 = no cap. */
  maxActivePerTenant: number;
  /** AGENT_RUN_MAX_ACTIVE_PER_PROJECT: the same per project; 0 = off. */
  maxActivePerProject: number;
  /** AGENT_RUN_CONCURRENCY: default-class queue workers per process. */
  runConcurrency: number;
  /** AGENT_SYNC_TIMEOUT_MS: how long an inline call holds the connection before answering 202. */
  syncTimeoutMs: number;
  /** AGENT_BACKGROUND_MAX_DURATION_MS: wall-clock ceiling of any run. */
  maxDurationMs: number;
  /** AGENT_RUN_DRAIN_TIMEOUT_MS: on SIGTERM, how long local runs may take to finish. */
  drainTimeoutMs: number;
  /** AGENT_DEFERRED_MAX_RUNNING_PER_TENANT: deferred runs running at once per tenant. */
  deferredMaxRunningPerTenant: number;
  /** AGENT_DEFERRED_MAX_QUEUED_PER_TENANT: deferred runs queued or scheduled per tenant. */
  deferredMaxQueuedPerTenant: number;
  /** AGENT_DEFERRED_CONCURRENCY: deferred queue workers per process; default half of runConcurrency, at least 1. */
  deferredConcurrency: number;
  /** AGENT_DEFERRED_MAX_WAIT_MS: a deferred run not started this long after it became due fails `expired`. */
  deferredMaxWaitMs: number;
  /**
   * SLUICE_NODE_STALE_MS: a server process silent this long is gone, and the runs it was
   * running end `worker_lost`. It heartbeats every quarter of this.
   */
  nodeStaleMs: number;
}

export const settingDefaults: ServerSettings = Object.freeze({
  maxActivePerTenant: 250,
  maxActivePerProject: 0,
  runConcurrency: 4,
  syncTimeoutMs: 600_000,
  maxDurationMs: 1_800_000,
  drainTimeoutMs: 10_000,
  deferredMaxRunningPerTenant: 2,
  deferredMaxQueuedPerTenant: 10_000,
  nodeStaleMs: 20_000,
  deferredConcurrency: 2,
  deferredMaxWaitMs: 86_400_000,
});

const variables: Record<keyof ServerSettings, string> = {
  maxActivePerTenant: 'AGENT_RUN_MAX_ACTIVE_PER_TENANT',
  maxActivePerProject: 'AGENT_RUN_MAX_ACTIVE_PER_PROJECT',
  runConcurrency: 'AGENT_RUN_CONCURRENCY',
  syncTimeoutMs: 'AGENT_SYNC_TIMEOUT_MS',
  maxDurationMs: 'AGENT_BACKGROUND_MAX_DURATION_MS',
  drainTimeoutMs: 'AGENT_RUN_DRAIN_TIMEOUT_MS',
  deferredMaxRunningPerTenant: 'AGENT_DEFERRED_MAX_RUNNING_PER_TENANT',
  deferredMaxQueuedPerTenant: 'AGENT_DEFERRED_MAX_QUEUED_PER_TENANT',
  nodeStaleMs: 'SLUICE_NODE_STALE_MS',
  deferredConcurrency: 'AGENT_DEFERRED_CONCURRENCY',
  deferredMaxWaitMs: 'AGENT_DEFERRED_MAX_WAIT_MS',
};

/** Config-file settings, then environment variables on top; every value checked. */
export function resolveSettings(
  fromConfig: Partial<ServerSettings> = {},
  env: NodeJS.ProcessEnv = process.env,
): ServerSettings {
  const out = { ...settingDefaults } as ServerSettings;
  let deferredConcurrencyGiven = false;
  for (const key of Object.keys(variables) as (keyof ServerSettings)[]) {
    const name = variables[key];
    const raw: unknown = env[name] !== undefined && env[name] !== '' ? env[name] : fromConfig[key];
    if (raw === undefined) continue;
    const value = typeof raw === 'string' ? Number(raw) : raw;
    const min = [
      'runConcurrency',
      'syncTimeoutMs',
      'maxDurationMs',
      'nodeStaleMs',
      'deferredConcurrency',
      'deferredMaxWaitMs',
    ].includes(key)
      ? 1
      : 0;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
      throw new TypeError(
        `Expected ${name} (settings.${key}) to be a whole number >= ${min}, got \`${String(raw)}\``,
      );
    }
    out[key] = value;
    if (key === 'deferredConcurrency') deferredConcurrencyGiven = true;
  }
  if (!deferredConcurrencyGiven) out.deferredConcurrency = Math.max(1, Math.floor(out.runConcurrency / 2));
  return Object.freeze(out);
}
