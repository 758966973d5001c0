import type { Agent } from 'sluice';
import type { ServerSettings } from './settings.js';

/** What a `sluice.config.*` module exports. */
export interface SluiceConfig {
  /** The agents the server runs, by the name used in `/agents/{agent}/runs`. */
  agents: Record<string, Agent<string> | Agent<never>>;
  /** Per-tenant quotas. */
  tenants?: Record<string, { maxConcurrentAgentRuns?: number }>;
  /** Settings; the spec's environment variables override them. */
  settings?: Partial<ServerSettings>;
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
  return config;
}
