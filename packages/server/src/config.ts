import type { Agent } from 'sluice';
import type { RunsConfig, ServerSettings, WebsocketConfig } from './settings.js';

/** A period for quotas: a sliding window of that length. */
export type QuotaPeriod = 'hour' | 'day' | 'month';

export interface TenantQuota {
  /** Default-class runs active at once (the cap is the smaller of this and the setting). */
  maxConcurrentAgentRuns?: number;
  /** Runs admitted per period; more get 429 agent_quota_exceeded (Retry-After: 60). */
  runs?: { limit: number; per: QuotaPeriod };
  /** Spend (usage cost from model prices, USD) per period; over it, 429 spend_limit_exceeded. */
  spend?: { limitUsd: number; per: QuotaPeriod };
  /** The agents this tenant may run; without it, every agent. Others answer 404, as if they did not exist. */
  agents?: string[];
}

/** What a `sluice.config.*` module exports. */
export interface SluiceConfig {
  /** The agents the server runs, by the name used in `/agents/{agent}/runs`. */
  agents: Record<string, Agent<string> | Agent<never>>;
  /** Per-tenant quotas. */
  tenants?: Record<string, TenantQuota>;
  /** Settings; the spec's environment variables override them. */
  settings?: Partial<ServerSettings>;
  /** Bounds of held runs: `timeoutMs`, `maxConcurrentPerUser`, `maxParallelToolCalls`, `threadBusyWaitMs`. */
  runs?: RunsConfig;
  /** Connection caps of `GET /ws`: `maxConnections`, `maxConnectionsPerUser`. */
  websocket?: WebsocketConfig;
  /** Called when the server stops (close a provider stand-in, pools...). */
  close?: () => Promise<void> | void;
}

/**
 * Declares the server's agents and settings.
 *
 * @example
 * export default defineConfig({
 *   agents: { analyst: createAgent({ model: 'anthropic/claude-sonnet-4-5', concurrency: { limiter } }) },
 *   tenants: { acme: { maxConcurrentAgentRuns: 100 } },
 * });
 */
export function defineConfig(config: SluiceConfig): SluiceConfig {
  if (!config || typeof config.agents !== 'object' || Object.keys(config.agents).length === 0) {
    throw new TypeError('Expected `agents` to name at least one agent');
  }
  for (const name of Object.keys(config.agents)) {
    if (!/^[A-Za-z0-9_-]{1,64}$/.test(name)) {
      throw new TypeError(`Expected agent names to be 1 to 64 letters, digits, _ or -, got \`${name}\``);
    }
  }
  for (const [tenant, quota] of Object.entries(config.tenants ?? {})) {
    for (const name of quota.agents ?? []) {
      if (!Object.hasOwn(config.agents, name)) {
        throw new TypeError(`Tenant \`${tenant}\` lists agent \`${name}\`, which is not in \`agents\``);
      }
    }
  }
  return config;
}

type AnyAgent = SluiceConfig['agents'][string];

/**
 * The agent a tenant may run under `name`, or undefined. Own keys only: `__proto__`,
 * `constructor` and the like are names of nothing.
 */
export function agentFor(config: SluiceConfig, tenant: string, name: string): AnyAgent | undefined {
  if (!Object.hasOwn(config.agents, name)) return undefined;
  const allowed =
    config.tenants && Object.hasOwn(config.tenants, tenant) ? config.tenants[tenant]!.agents : undefined;
  if (allowed && !allowed.includes(name)) return undefined;
  return config.agents[name];
}

/** A tenant's quotas, by own key only. */
export function tenantQuota(config: SluiceConfig, tenant: string): TenantQuota | undefined {
  return config.tenants && Object.hasOwn(config.tenants, tenant) ? config.tenants[tenant] : undefined;
}
