import type { Database } from '@sluice/postgres/database';
import type { Clock } from 'sluice/concurrency';
import type { CacheStore } from '../cache/store.js';
import type { SluiceConfig } from '../config.js';
import type { Ops } from '../ops/index.js';
import type { TenantLimits } from '../runs/policy.js';
import { GatewayAccounting } from './accounting.js';
import { resolveGateways } from './config.js';
import { Gateways } from './gateways.js';
import { GatewayMetrics } from './metrics.js';

export type { GatewayApi, GatewayConfig } from './config.js';
export { Gateways } from './gateways.js';

/** The gateways of a config, wired to the server's parts: the cache's places, the store, the metrics, the logs. */
export function createGateways(parts: {
  config: SluiceConfig;
  db: Database;
  cache: CacheStore;
  limitsFor: (tenant: string) => TenantLimits;
  ops: Ops;
  clock: Clock;
  log: (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;
}): Gateways {
  const resolved = resolveGateways(parts.config.gateways, parts.config.tenants);
  const { ops } = parts;
  return new Gateways(resolved, {
    accounting: new GatewayAccounting(parts.db, parts.cache, parts.limitsFor),
    metrics: new GatewayMetrics(ops.metrics.registry, resolved.keys()),
    traffic: ops.gatewayTraffic,
    clock: parts.clock,
    onSlotEvent: (event) => {
      ops.slots.observe(event);
      ops.metrics.observe(event);
    },
    log: (line) => parts.log('info', 'gateway request', line),
    warn: (message, error) => parts.log('warn', message, { error: String(error) }),
  });
}
