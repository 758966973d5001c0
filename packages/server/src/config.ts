import type { Agent, ConcurrencyConfigError } from 'sluice';
import { runClasses, type RunClass } from './runs/lifecycle.js';
import type { RunsConfig, ServerSettings, WebsocketConfig } from './settings.js';
import { resolveGateways, type GatewayConfig } from './gateway/config.js';

/** A period for quotas: a sliding window of that length. */
export type QuotaPeriod = 'hour' | 'day' | 'month';

export interface TenantQuota {
  /** Default-class runs active at once (the cap is the smaller of this and the setting); 0: none at all, not "no cap". */
  maxConcurrentAgentRuns?: number;
  /** Runs admitted per period; more get 429 agent_quota_exceeded (Retry-After: 60). */
  runs?: { limit: number; per: QuotaPeriod };
  /** Spend (usage cost from model prices, USD) per period; over it, 429 spend_limit_exceeded. */
  spend?: { limitUsd: number; per: QuotaPeriod };
  /** The agents this tenant may run; without it, every agent. Others answer 404, as if they did not exist. */
  agents?: string[];
  /** The gateways this tenant may use; without it, every gateway. Others answer 403. */
  gateways?: string[];
}

/** What a `sluice.config.*` module exports. */
export interface SluiceConfig {
  /** The agents the server runs, by the name used in `/agents/{agent}/runs`. */
  agents: Record<string, Agent<string> | Agent<never>>;
  /** Provider gateways: `/api/client/v1/gateway/NAME/...` forwards to each one's `upstream`, taking slots of its limiter. */
  gateways?: Record<string, GatewayConfig>;
  /** Per-tenant quotas. */
  tenants?: Record<string, TenantQuota>;
  /** Settings; the spec's environment variables override them. */
  settings?: Partial<ServerSettings>;
  /** Bounds of held runs: `timeoutMs`, `maxConcurrentPerUser`, `maxParallelToolCalls`, `threadBusyWaitMs`. */
  runs?: RunsConfig;
  /** Where places, revocations and the failed-auth limiter live (SLUICE_CACHE_STORE overrides). @default 'memory' */
  cacheStore?: 'memory' | 'redis';
  /** The Redis of the `redis` cache store (REDIS_URL overrides). */
  redisUrl?: string;
  /**
   * The workload of each agent's limiter that runs of a class make their provider requests in:
   * `{ default: { workload: 'interactive' }, deferred: { workload: 'background' } }` keeps
   * deferred work to its workload's ceiling, out of slots reserved for interactive work. Every
   * agent with a limiter must have the workloads named (checked at start). Agents without a
   * limiter take no slots and ignore it. Without it, runs use their agent's own workload.
   */
  classes?: Partial<Record<RunClass, { workload: string }>>;
  /** Connection caps of `GET /ws`: `maxConnections`, `maxConnectionsPerUser`. */
  websocket?: WebsocketConfig;
  /** Called when the server stops (close a provider stand-in, pools...). */
  close?: () => Promise<void> | void;
}

/**
 * A config module that could not be loaded because of one of its limiters: `cause` is the
 * limiter's `ConcurrencyConfigError`, with `limiter`, `field` and `value`.
 */
export class ConfigLoadError extends Error {
  override readonly name = 'ConfigLoadError';
  constructor(
    message: string,
    readonly file: string,
    override readonly cause: ConcurrencyConfigError,
  ) {
    super(message, { cause });
  }

  /** The option at fault, such as `rate.tokensPerMinute`. */
  get field(): string | undefined {
    return this.cause.field;
  }

  get limiter(): string {
    return this.cause.limiter;
  }
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
  checkClasses(config);
  resolveGateways(config.gateways, config.tenants);
  return config;
}

/**
 * Checks `classes`: known class names, and that each agent's limiter has each class's workload.
 * Throws a TypeError naming the class, the workload and the agent.
 */
export function checkClasses(config: SluiceConfig): void {
  if (config.classes === undefined) return;
  if (config.classes === null || typeof config.classes !== 'object')
    throw new TypeError(`Expected \`classes\` to be an object, got \`${String(config.classes)}\``);
  for (const [name, value] of Object.entries(config.classes)) {
    if (!(runClasses as readonly string[]).includes(name))
      throw new TypeError(`Expected \`classes\` keys to be ${runClasses.join(' or ')}, got \`${name}\``);
    const workload = (value as { workload?: unknown } | undefined)?.workload;
    if (typeof workload !== 'string' || workload === '')
      throw new TypeError(
        `Expected \`classes.${name}.workload\` to be a workload name, got \`${String(workload)}\``,
      );
    for (const [agentName, agent] of Object.entries(config.agents)) {
      try {
        (agent as Agent<string>).checkWorkload(workload);
      } catch (error) {
        throw new TypeError(
          `Class \`${name}\` runs in workload \`${workload}\`, which the limiter of agent \`${agentName}\` lacks: ` +
            (error instanceof Error ? error.message : String(error)),
        );
      }
    }
  }
}

/** The workload a run of `runClass` asks `agent` for; undefined: the agent's own choice. */
export function workloadOf(config: SluiceConfig, runClass: RunClass, agent: AnyAgent): string | undefined {
  const workload = config.classes?.[runClass]?.workload;
  if (workload === undefined) return undefined;
  return (agent as Agent<string>).checkWorkload(workload);
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
