import type { ConcurrencyLimiter, ConcurrencyStats } from 'sluice';
import type { SluiceConfig } from '../config.js';

/**
 * The limiters the config's agents name, by limiter name. Two limiter objects under one name
 * are one limiter to an operator: a shared limiter opened twice counts the same rows, and an
 * in-memory one named twice is a config mistake that the first one's figures make no worse.
 */
export function limitersOf(config: SluiceConfig): Map<string, ConcurrencyLimiter<string>> {
  const limiters = new Map<string, ConcurrencyLimiter<string>>();
  for (const agent of Object.values(config.agents)) {
    const limiter = (agent as { limiter?: ConcurrencyLimiter<string> }).limiter;
    if (limiter && !limiters.has(limiter.name)) limiters.set(limiter.name, limiter);
  }
  // A gateway's limiter is often an agent's too (one provider account): one limiter, one row.
  for (const gateway of Object.values(config.gateways ?? {})) {
    const limiter = gateway?.limiter;
    if (limiter && typeof limiter.name === 'string' && !limiters.has(limiter.name))
      limiters.set(limiter.name, limiter);
  }
  return limiters;
}

/** One read of every limiter's stats, shared by the slot and the capacity figures of a scrape. */
export interface StatsRead {
  /** The stats of each limiter that keeps them and answered. */
  readonly stats: ReadonlyMap<string, ConcurrencyStats<string>>;
  /** Limiters that keep stats, whether or not they answered this time. */
  readonly withStats: ReadonlySet<string>;
}

/**
 * Asks every limiter that keeps stats, at once. One that fails is left out of `stats` (its
 * figures go absent for this read: an alert on them fires, a stale figure would not).
 */
export async function readStats(limiters: Iterable<ConcurrencyLimiter<string>>): Promise<StatsRead> {
  const stats = new Map<string, ConcurrencyStats<string>>();
  const withStats = new Set<string>();
  await Promise.all(
    [...limiters].map(async (limiter) => {
      if (!limiter.stats) return;
      withStats.add(limiter.name);
      try {
        stats.set(limiter.name, await limiter.stats());
      } catch {
        // Left out, as said above.
      }
    }),
  );
  return { stats, withStats };
}
