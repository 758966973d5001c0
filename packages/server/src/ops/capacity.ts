import type { ConcurrencyEvent, ConcurrencyLimiter } from 'sluice';
import type { BudgetName, BudgetStats } from 'sluice/concurrency';
import type { StatsRead } from './limiters.js';

/** The budgets in the order the dashboard and the metrics list them. */
export const budgetNames = [
  'requests',
  'tokens',
  'inputTokens',
  'outputTokens',
] as const satisfies readonly BudgetName[];

/**
 * One limiter's provider capacity: its effective concurrency limit, its per-minute budgets and
 * the provider's overload signals it heard. Figures a limiter does not give are absent.
 */
export interface LimiterCapacity {
  readonly limiter: string;
  /** The effective limit (`maxConcurrent` unless the adaptive limit lowered it). */
  readonly limit?: number;
  /** Each configured budget: what a grant could take now, and its per-minute figure. */
  readonly budgets: { readonly [K in BudgetName]?: BudgetStats };
  /** `provider-throttled` events the limiter sent this process since it started. */
  readonly throttled?: number;
  /** When the last of them came (ISO), or null. */
  readonly lastThrottledAt?: string | null;
}

interface Throttles {
  count: number;
  lastAt: number | undefined;
}

/**
 * Capacity figures of the config's limiters. The limit and the budgets are read from `stats()`
 * at read time (for a shared limiter: its state in the database); throttles are counted from
 * the limiter's own events (`subscribe`), whoever caused them: a run of this server, another
 * program on the same limiter. A limiter with neither (a custom one) is left out.
 */
export class CapacityBook {
  readonly #throttles = new Map<string, Throttles>();
  readonly #unsubscribe: (() => void)[] = [];
  readonly #listeners = new Set<(limiter: string) => void>();

  constructor(limiters: ReadonlyMap<string, ConcurrencyLimiter<string>>) {
    for (const limiter of limiters.values()) {
      if (typeof limiter.subscribe !== 'function') continue;
      const throttles: Throttles = { count: 0, lastAt: undefined };
      this.#throttles.set(limiter.name, throttles);
      const name = limiter.name;
      this.#unsubscribe.push(limiter.subscribe((event) => this.#heard(name, throttles, event)));
    }
  }

  /** Limiters whose throttles are counted (those that can be subscribed to). */
  get counted(): readonly string[] {
    return [...this.#throttles.keys()];
  }

  /** Calls `listener` with the limiter's name at each `provider-throttled` event. */
  onThrottled(listener: (limiter: string) => void): void {
    this.#listeners.add(listener);
  }

  /** Every limiter's capacity, from one read of the stats; sorted by name. */
  read(read: StatsRead): LimiterCapacity[] {
    const out: LimiterCapacity[] = [];
    const names = new Set([...read.stats.keys(), ...this.#throttles.keys()]);
    for (const name of names) {
      const stats = read.stats.get(name);
      const throttles = this.#throttles.get(name);
      const budgets: Partial<Record<BudgetName, BudgetStats>> = {};
      for (const budget of budgetNames) {
        const b = stats?.budgets?.[budget];
        if (b) budgets[budget] = { available: b.available, capacity: b.capacity };
      }
      const hasBudgets = Object.keys(budgets).length > 0;
      if (stats?.limit === undefined && !hasBudgets && !throttles) continue;
      // A limiter that keeps stats but failed to answer is left out, as its slots are.
      if (!stats && read.withStats.has(name)) continue;
      out.push({
        limiter: name,
        ...(stats?.limit === undefined ? {} : { limit: stats.limit }),
        budgets,
        ...(throttles
          ? {
              throttled: throttles.count,
              lastThrottledAt:
                throttles.lastAt === undefined ? null : new Date(throttles.lastAt).toISOString(),
            }
          : {}),
      });
    }
    return out.sort((a, b) => a.limiter.localeCompare(b.limiter));
  }

  /** Stops listening to the limiters: they may outlive this server (a test, an embedding host). */
  close(): void {
    for (const stop of this.#unsubscribe.splice(0)) stop();
    this.#listeners.clear();
  }

  #heard(name: string, throttles: Throttles, event: ConcurrencyEvent): void {
    if (event.type !== 'provider-throttled') return;
    throttles.count++;
    throttles.lastAt = event.at;
    for (const listener of this.#listeners) listener(name);
  }
}
