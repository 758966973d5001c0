import { tenantQuota, type SluiceConfig } from '../config.js';
import type { ServerSettings } from '../settings.js';

const HOUR = 3_600_000;
const periodMs = { hour: HOUR, day: 24 * HOUR, month: 30 * 24 * HOUR } as const;
/** The longest period a quota or spend limit can count over: nothing older is ever read for one. */
export const longestPeriodMs = Math.max(...Object.values(periodMs));

/** What one tenant may do, fixed at boot from the config and the settings (0 = no cap). */
export interface TenantLimits {
  /** Default-class runs queued or running. */
  activePerTenant: number;
  /**
   * The tenant's quota `maxConcurrentAgentRuns` is 0: it may have no default-class run at all
   * (a cap of 0 elsewhere means no cap, so this cannot be said with `activePerTenant`).
   */
  defaultClosed?: boolean;
  activePerProject: number;
  /** Deferred runs queued or scheduled. */
  deferredQueued: number;
  /** Default-class runs waiting for their time. */
  scheduled: number;
  runQuota?: { limit: number; windowMs: number };
  spend?: { limitUsd: number; windowMs: number };
}

/** Resolves each tenant's limits once and keeps them: admission and promotion read the same table. */
export function tenantPolicy(
  config: SluiceConfig,
  settings: ServerSettings,
): (tenant: string) => TenantLimits {
  const known = new Map<string, TenantLimits>();
  return (tenant) => {
    let limits = known.get(tenant);
    if (limits) return limits;
    const quota = tenantQuota(config, tenant);
    const setting = settings.maxActivePerTenant;
    const own = quota?.maxConcurrentAgentRuns;
    limits = Object.freeze({
      // The smaller of the setting and the tenant's own cap, where 0 means none.
      activePerTenant: own === undefined ? setting : setting === 0 ? own : Math.min(setting, own),
      defaultClosed: own === 0,
      activePerProject: settings.maxActivePerProject,
      deferredQueued: settings.deferredMaxQueuedPerTenant,
      scheduled: settings.maxScheduledPerTenant,
      runQuota: quota?.runs && { limit: quota.runs.limit, windowMs: periodMs[quota.runs.per] },
      spend: quota?.spend && { limitUsd: quota.spend.limitUsd, windowMs: periodMs[quota.spend.per] },
    });
    // Bounded: tenant names come from tokens, but a table of them should not grow without end.
    if (known.size > 10_000) known.clear();
    known.set(tenant, limits);
    return limits;
  };
}
