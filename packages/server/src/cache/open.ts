import type { SluiceConfig } from '../config.js';
import type { ServerSettings } from '../settings.js';
import { MemoryCacheStore } from './memory.js';
import { RedisCacheStore } from './redis.js';
import type { CacheStore } from './store.js';

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

/** The config's settings with its top-level `cacheStore` and `redisUrl` among them. */
export function settingsOfConfig(config: SluiceConfig): Partial<ServerSettings> {
  return {
    ...config.settings,
    ...(config.cacheStore !== undefined && { cacheStore: config.cacheStore }),
    ...(config.redisUrl !== undefined && { redisUrl: config.redisUrl }),
  };
}

/**
 * Opens the configured cache store. Places in Redis live on a lease as long as a thread's lock
 * (3 x nodeStaleMs, 60 s by default): a process killed while holding them gives them back then.
 */
export async function openCacheStore(settings: ServerSettings, log: Log): Promise<CacheStore> {
  if (settings.cacheStore === 'redis') {
    return RedisCacheStore.open({
      url: settings.redisUrl!,
      leaseMs: 3 * settings.nodeStaleMs,
      warn: (message, fields) => log('warn', message, fields),
    });
  }
  return new MemoryCacheStore({ warn: (message, fields) => log('warn', message, fields) });
}

/**
 * What a server on a shared PostgreSQL with the memory cache store must say at start: other
 * processes on that database do not see its counts. Embedded PGlite is one process's anyway.
 */
export function perProcessWarning(store: CacheStore, onPostgres: boolean): string | undefined {
  if (store.kind !== 'memory' || !onPostgres) return undefined;
  return (
    'cache store is memory: the per-user cap of held runs, the WebSocket connection caps and the ' +
    'failed-authentication limiter count per process, not across the server processes on this ' +
    'database; set SLUICE_CACHE_STORE=redis and REDIS_URL to share them'
  );
}
