/** The server's settings, under the spec's names; environment variables override the config file. */

import { DAY, MAX_TIMER_MS, MINUTE, SECOND } from './units.js';

export interface ServerSettings {
  /** AGENT_RUN_MAX_ACTIVE_PER_TENANT: default-class queued + running runs per tenant; 0 = no cap. */
  maxActivePerTenant: number;
  /** AGENT_RUN_MAX_ACTIVE_PER_PROJECT: the same per project; 0 = off. */
  maxActivePerProject: number;
  /** AGENT_RUN_CONCURRENCY: default-class queue workers per process. */
  runConcurrency: number;
  /** AGENT_SYNC_TIMEOUT_MS: how long a waiting call is held before it is answered 202. */
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
   * running end `worker_lost`. It heartbeats every quarter of this, and stops its own runs
   * when its last heartbeat is three quarters of this old.
   */
  nodeStaleMs: number;
  /** SLUICE_MAX_SCHEDULED_PER_TENANT: default-class runs waiting for their `run_at` per tenant; 0 = no cap. */
  maxScheduledPerTenant: number;
  /** SLUICE_MAX_CONNECTIONS: open HTTP connections per process; more are refused by the socket layer. */
  maxConnections: number;
  /**
   * SLUICE_REQUEST_TIMEOUT_MS: how long a client may take to send a whole request (headers and
   * body); a connection that trickles its body is closed. Held responses are not bounded by it.
   */
  requestTimeoutMs: number;
  /** SLUICE_DB_STATEMENT_TIMEOUT_MS: the longest one SQL statement (or lock wait) may take. */
  statementTimeoutMs: number;
  /** SLUICE_DB_POOL_SIZE: PostgreSQL connections per process. */
  poolSize: number;
  /**
   * SLUICE_DB_PREPARED_STATEMENTS: 1 prepares the hot statements (claims, ends, admission) once
   * per connection on a direct PostgreSQL connection; never behind a pooler that refuses
   * settings at connect (PgBouncer). 0 for a pooler in transaction mode that accepts them.
   */
  preparedStatements: boolean;
  /** SLUICE_CALLBACK_ALLOW_PRIVATE: 1 lets callbacks reach loopback and private addresses (on-premises setups, tests). */
  callbackAllowPrivate: boolean;
  /**
   * SLUICE_RUN_TIMEOUT_MS (`runs.timeoutMs`): the longest a held run (inline or streamed) may
   * take; null: no limit. Default 300,000 with MODE=production (or, without MODE, NODE_ENV=production), none otherwise.
   */
  runTimeoutMs: number | null;
  /** SLUICE_MAX_CONCURRENT_PER_USER (`runs.maxConcurrentPerUser`): held runs of one user at once; 0 = no cap. */
  maxConcurrentPerUser: number;
  /** SLUICE_MAX_PARALLEL_TOOL_CALLS (`runs.maxParallelToolCalls`): tool calls of one turn run at once; clients may only lower it. */
  maxParallelToolCalls: number;
  /** SLUICE_THREAD_BUSY_WAIT_MS (`runs.threadBusyWaitMs`): how long a held run waits for a busy thread before 409. */
  threadBusyWaitMs: number;
  /** SLUICE_STREAM_KEEP_ALIVE_MS: a streamed run sends a comment line when it has been quiet this long. */
  streamKeepAliveMs: number;
  /** SLUICE_STREAM_RETENTION_MS: how long a run's stored events stay readable (resumable) after it ended. */
  streamRetentionMs: number;
  /** SLUICE_CACHE_STORE (`cacheStore`): where places, revocations and the failed-auth limiter live. */
  cacheStore: 'memory' | 'redis';
  /** REDIS_URL (`redisUrl`): the Redis of the `redis` cache store. */
  redisUrl: string | null;
  /**
   * SLUICE_TRUST_PROXY_HOPS: how many proxies in front of the server append to X-Forwarded-For;
   * the client address is read that many entries from its end. 0 (the default): the socket's
   * address, and the header is ignored (a client could write any address into it).
   */
  trustProxyHops: number;
  /** SLUICE_WS_MAX_CONNECTIONS (`websocket.maxConnections`): open WebSocket connections of the server. */
  wsMaxConnections: number;
  /** SLUICE_WS_MAX_CONNECTIONS_PER_USER (`websocket.maxConnectionsPerUser`): those of one user; 0 = no cap. */
  wsMaxConnectionsPerUser: number;
  /** MEDIA_MAX_SIZE_MB: the largest file `POST /files` stores, in MiB; a larger one is 413. */
  mediaMaxSizeMb: number;
}

/** The `websocket` block of a config: the connection caps of `GET /ws`. */
export interface WebsocketConfig {
  maxConnections?: number;
  /** null or 0: no cap. */
  maxConnectionsPerUser?: number | null;
}

/** The `runs` block of a config: the bounds of held runs, under the names of the settings file. */
export interface RunsConfig {
  /** null or 0: no limit, even with NODE_ENV=production. */
  timeoutMs?: number | null;
  /** null or 0: no cap. */
  maxConcurrentPerUser?: number | null;
  maxParallelToolCalls?: number;
  threadBusyWaitMs?: number;
}

/** The run timeout when nothing sets one: bounded in production, open while developing. */
const defaultRunTimeoutMs = (env: NodeJS.ProcessEnv) => (isProduction(env) ? 5 * MINUTE : null);

/**
 * MODE (the spec's name) decides when it is set, so `MODE=development` opens the timeout even in
 * an image that sets NODE_ENV=production; without it, NODE_ENV does. A misspelt MODE would
 * silently mean development, so anything but the two names is refused.
 */
function isProduction(env: NodeJS.ProcessEnv): boolean {
  const mode = env.MODE;
  if (mode === undefined || mode === '') return env.NODE_ENV === 'production';
  if (mode !== 'production' && mode !== 'development')
    throw new SettingsError('MODE', mode, `Expected MODE to be production or development, got \`${mode}\``);
  return mode === 'production';
}

export const settingDefaults: ServerSettings = Object.freeze({
  maxActivePerTenant: 250,
  maxActivePerProject: 0,
  runConcurrency: 4,
  syncTimeoutMs: 10 * MINUTE,
  maxDurationMs: 30 * MINUTE,
  drainTimeoutMs: 10 * SECOND,
  deferredMaxRunningPerTenant: 2,
  deferredMaxQueuedPerTenant: 10_000,
  nodeStaleMs: 20 * SECOND,
  deferredConcurrency: 2,
  deferredMaxWaitMs: DAY,
  maxScheduledPerTenant: 10_000,
  maxConnections: 10_000,
  requestTimeoutMs: 30 * SECOND,
  statementTimeoutMs: 15 * SECOND,
  poolSize: 20,
  callbackAllowPrivate: false,
  preparedStatements: true,
  runTimeoutMs: null,
  maxConcurrentPerUser: 10,
  maxParallelToolCalls: 10,
  threadBusyWaitMs: 30 * SECOND,
  streamKeepAliveMs: 15 * SECOND,
  streamRetentionMs: 10 * MINUTE,
  cacheStore: 'memory',
  redisUrl: null,
  trustProxyHops: 0,
  wsMaxConnections: 1_000,
  wsMaxConnectionsPerUser: 10,
  mediaMaxSizeMb: 25,
});

type NumericKey = {
  [K in keyof ServerSettings]: ServerSettings[K] extends number ? K : never;
}[keyof ServerSettings];

/** Where each `runs.*` key of a config lands among the settings. */
const runsKeys = {
  maxConcurrentPerUser: 'maxConcurrentPerUser',
  maxParallelToolCalls: 'maxParallelToolCalls',
  threadBusyWaitMs: 'threadBusyWaitMs',
} as const satisfies Partial<Record<keyof RunsConfig, NumericKey>>;

/** Where each `websocket.*` key of a config lands among the settings. */
const websocketKeys = {
  maxConnections: 'wsMaxConnections',
  maxConnectionsPerUser: 'wsMaxConnectionsPerUser',
} as const satisfies Record<keyof WebsocketConfig, NumericKey>;

/** Each numeric setting: its variable and its range (values past a timer's range would fire at once). */
const numeric: Record<NumericKey, { variable: string; min: number; max: number }> = {
  maxActivePerTenant: { variable: 'AGENT_RUN_MAX_ACTIVE_PER_TENANT', min: 0, max: 1_000_000 },
  maxActivePerProject: { variable: 'AGENT_RUN_MAX_ACTIVE_PER_PROJECT', min: 0, max: 1_000_000 },
  runConcurrency: { variable: 'AGENT_RUN_CONCURRENCY', min: 1, max: 1000 },
  syncTimeoutMs: { variable: 'AGENT_SYNC_TIMEOUT_MS', min: 1, max: MAX_TIMER_MS },
  maxDurationMs: { variable: 'AGENT_BACKGROUND_MAX_DURATION_MS', min: 1, max: MAX_TIMER_MS },
  drainTimeoutMs: { variable: 'AGENT_RUN_DRAIN_TIMEOUT_MS', min: 0, max: MAX_TIMER_MS },
  deferredMaxRunningPerTenant: { variable: 'AGENT_DEFERRED_MAX_RUNNING_PER_TENANT', min: 0, max: 1_000_000 },
  deferredMaxQueuedPerTenant: { variable: 'AGENT_DEFERRED_MAX_QUEUED_PER_TENANT', min: 0, max: 100_000_000 },
  nodeStaleMs: { variable: 'SLUICE_NODE_STALE_MS', min: 100, max: MAX_TIMER_MS },
  deferredConcurrency: { variable: 'AGENT_DEFERRED_CONCURRENCY', min: 1, max: 1000 },
  deferredMaxWaitMs: { variable: 'AGENT_DEFERRED_MAX_WAIT_MS', min: 1, max: 365 * DAY },
  maxScheduledPerTenant: { variable: 'SLUICE_MAX_SCHEDULED_PER_TENANT', min: 0, max: 100_000_000 },
  maxConnections: { variable: 'SLUICE_MAX_CONNECTIONS', min: 1, max: 1_000_000 },
  requestTimeoutMs: { variable: 'SLUICE_REQUEST_TIMEOUT_MS', min: SECOND, max: 10 * MINUTE },
  statementTimeoutMs: { variable: 'SLUICE_DB_STATEMENT_TIMEOUT_MS', min: 100, max: MAX_TIMER_MS },
  poolSize: { variable: 'SLUICE_DB_POOL_SIZE', min: 2, max: 1000 },
  maxConcurrentPerUser: { variable: 'SLUICE_MAX_CONCURRENT_PER_USER', min: 0, max: 1_000_000 },
  maxParallelToolCalls: { variable: 'SLUICE_MAX_PARALLEL_TOOL_CALLS', min: 1, max: 10_000 },
  threadBusyWaitMs: { variable: 'SLUICE_THREAD_BUSY_WAIT_MS', min: 0, max: MAX_TIMER_MS },
  streamKeepAliveMs: { variable: 'SLUICE_STREAM_KEEP_ALIVE_MS', min: 100, max: 10 * MINUTE },
  streamRetentionMs: { variable: 'SLUICE_STREAM_RETENTION_MS', min: SECOND, max: 7 * DAY },
  trustProxyHops: { variable: 'SLUICE_TRUST_PROXY_HOPS', min: 0, max: 10 },
  wsMaxConnections: { variable: 'SLUICE_WS_MAX_CONNECTIONS', min: 1, max: 1_000_000 },
  wsMaxConnectionsPerUser: { variable: 'SLUICE_WS_MAX_CONNECTIONS_PER_USER', min: 0, max: 1_000_000 },
  // A file is held in memory while it is received and stored as one bytea value (1 GB at most).
  mediaMaxSizeMb: { variable: 'MEDIA_MAX_SIZE_MB', min: 1, max: 512 },
};

/** A setting that cannot be used, naming its variable, its range and the value given. */
export class SettingsError extends Error {
  override readonly name = 'SettingsError';
  constructor(
    readonly variable: string,
    readonly value: unknown,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Config-file settings (`settings`, and the `runs` block under its own names), then environment
 * variables on top; every value checked against its range.
 */
export function resolveSettings(
  settings: Partial<ServerSettings> = {},
  env: NodeJS.ProcessEnv = process.env,
  runs: RunsConfig = {},
  websocket: WebsocketConfig = {},
): ServerSettings {
  // A key that names no setting is a typo (or another server's name for it): refused, not ignored.
  for (const key of Object.keys(settings)) {
    if (!Object.hasOwn(settingDefaults, key))
      throw new SettingsError(
        `settings.${key}`,
        settings[key as keyof ServerSettings],
        `\`settings.${key}\` names no setting; the settings are ${Object.keys(settingDefaults).join(', ')}`,
      );
  }
  const runsNames = [...Object.keys(runsKeys), 'timeoutMs'];
  for (const key of Object.keys(runs)) {
    if (!runsNames.includes(key))
      throw new SettingsError(
        `runs.${key}`,
        runs[key as keyof RunsConfig],
        `\`runs.${key}\` names no setting; the runs block takes ${runsNames.join(', ')}`,
      );
  }
  for (const key of Object.keys(websocket)) {
    if (!Object.hasOwn(websocketKeys, key))
      throw new SettingsError(
        `websocket.${key}`,
        websocket[key as keyof WebsocketConfig],
        `\`websocket.${key}\` names no setting; the websocket block takes ${Object.keys(websocketKeys).join(', ')}`,
      );
  }
  const out: ServerSettings = { ...settingDefaults, runTimeoutMs: defaultRunTimeoutMs(env) };
  const fromConfig: Partial<Record<keyof ServerSettings, unknown>> = { ...settings };
  for (const [key, target] of Object.entries(runsKeys) as [keyof typeof runsKeys, NumericKey][]) {
    // null is "no cap" in the runs block; the settings say that with 0.
    if (runs[key] !== undefined) fromConfig[target] = runs[key] === null ? 0 : runs[key];
  }
  if (runs.timeoutMs !== undefined) fromConfig.runTimeoutMs = runs.timeoutMs;
  for (const [key, target] of Object.entries(websocketKeys) as [keyof WebsocketConfig, NumericKey][]) {
    if (websocket[key] !== undefined) fromConfig[target] = websocket[key] === null ? 0 : websocket[key];
  }
  const given = (variable: string, key: keyof ServerSettings): unknown =>
    env[variable] !== undefined && env[variable] !== '' ? env[variable] : fromConfig[key];
  for (const key of Object.keys(numeric) as NumericKey[]) {
    const { variable, min, max } = numeric[key];
    const raw = given(variable, key);
    if (raw === undefined) continue;
    const value = typeof raw === 'string' && /^-?\d+$/.test(raw.trim()) ? Number(raw) : raw;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
      throw new SettingsError(
        variable,
        raw,
        `Expected ${variable} (${configKeyOf(key)}) to be a whole number from ${min} to ${max}, got \`${String(raw)}\``,
      );
    }
    out[key] = value;
  }
  for (const [variable, key] of [
    ['SLUICE_CALLBACK_ALLOW_PRIVATE', 'callbackAllowPrivate'],
    ['SLUICE_DB_PREPARED_STATEMENTS', 'preparedStatements'],
  ] as const) {
    const flag = given(variable, key);
    if (flag === undefined) continue;
    if (![true, false, '1', '0', 'true', 'false'].includes(flag as string | boolean)) {
      throw new SettingsError(
        variable,
        flag,
        `Expected ${variable} (settings.${key}) to be 1 or 0, got \`${String(flag)}\``,
      );
    }
    out[key] = flag === true || flag === '1' || flag === 'true';
  }
  const timeout = given('SLUICE_RUN_TIMEOUT_MS', 'runTimeoutMs');
  if (timeout !== undefined) out.runTimeoutMs = runTimeout(timeout);
  Object.assign(
    out,
    cacheSettings(given('SLUICE_CACHE_STORE', 'cacheStore'), given('REDIS_URL', 'redisUrl')),
  );
  if (given('AGENT_DEFERRED_CONCURRENCY', 'deferredConcurrency') === undefined) {
    out.deferredConcurrency = Math.max(1, Math.floor(out.runConcurrency / 2));
  }
  return Object.freeze(out);
}

/** Where a setting is written in a config: `runs.*` for the bounds of held runs, else `settings.*`. */
function configKeyOf(key: NumericKey): string {
  const websocketKey = Object.entries(websocketKeys).find(([, target]) => target === key)?.[0];
  if (websocketKey !== undefined) return `websocket.${websocketKey}`;
  return Object.values(runsKeys).includes(key as never) ? `runs.${key}` : `settings.${key}`;
}

/** The cache store and its Redis: `redis` needs a redis:// or rediss:// URL. */
function cacheSettings(store: unknown, url: unknown): Pick<ServerSettings, 'cacheStore' | 'redisUrl'> {
  if (store !== undefined && store !== 'memory' && store !== 'redis')
    throw new SettingsError(
      'SLUICE_CACHE_STORE',
      store,
      `Expected SLUICE_CACHE_STORE (cacheStore) to be memory or redis, got \`${String(store)}\``,
    );
  if (url !== undefined && url !== null && (typeof url !== 'string' || !/^rediss?:\/\/\S+$/.test(url)))
    throw new SettingsError(
      'REDIS_URL',
      '(hidden)',
      'Expected REDIS_URL (redisUrl) to be a redis:// or rediss:// URL, got another value (not shown: it may hold a password)',
    );
  const redisUrl = typeof url === 'string' ? url : null;
  if (store === 'redis' && redisUrl === null)
    throw new SettingsError(
      'REDIS_URL',
      undefined,
      'SLUICE_CACHE_STORE (cacheStore) is redis, so REDIS_URL (redisUrl) must name the Redis, e.g. redis://127.0.0.1:6379',
    );
  return { cacheStore: store ?? 'memory', redisUrl };
}

/** `none`, null or 0: no run timeout; otherwise a whole number of milliseconds a timer can hold. */
function runTimeout(raw: unknown): number | null {
  if (raw === null || raw === 'none' || raw === 0 || raw === '0') return null;
  const value = typeof raw === 'string' && /^\d+$/.test(raw.trim()) ? Number(raw) : raw;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1 || value > MAX_TIMER_MS) {
    throw new SettingsError(
      'SLUICE_RUN_TIMEOUT_MS',
      raw,
      `Expected SLUICE_RUN_TIMEOUT_MS (runs.timeoutMs) to be \`none\` or a whole number of milliseconds from 1 to ${MAX_TIMER_MS}, got \`${String(raw)}\``,
    );
  }
  return value;
}
