import type { ConcurrencyEvent, ConcurrencyLimiter } from 'sluice';
import type { SluiceConfig } from '../config.js';
import { limitersOf, readStats, type StatsRead } from './limiters.js';

/** Slots in use and requests waiting, for one workload of one limiter. */
export interface WorkloadSlots {
  readonly limiter: string;
  readonly workload: string;
  readonly active: number;
  readonly queued: number;
  /**
   * `stats`: the limiter's own count (for a shared limiter, every process's slots);
   * `events`: what this process's runs did, for a limiter that keeps no stats.
   */
  readonly source: 'stats' | 'events';
}

type Counts = { active: number; queued: number };

/**
 * Every limiter the server's runs take slots from, and how full each is. A limiter that keeps
 * stats is asked at read time, so a PostgreSQL limiter reports the slots of all processes on its
 * database, not this one's share. The slot events of this process's runs keep a count too: it
 * is what a limiter without stats reports, and it finds limiters no agent names (a tool's child
 * agent with a limiter of its own).
 */
export class SlotBook {
  readonly limiters: ReadonlyMap<string, ConcurrencyLimiter<string>>;
  readonly #counts = new Map<string, Map<string, Counts>>();
  /** Open waits by request: a wait that never started (a spent budget) closes nothing. */
  readonly #waits = new Map<string, number>();

  constructor(config: SluiceConfig) {
    this.limiters = limitersOf(config);
  }

  /**
   * Counts one slot event. `wait-started` opens a wait that exactly one of `acquired`,
   * `timed-out`, `queue-full`, `wait-cancelled` or `limiter-error` closes; a held slot ends with
   * `released` or `lease-lost`.
   */
  observe(event: ConcurrencyEvent): void {
    const counts = this.#countsOf(event.limiter, event.workload);
    const key = [event.limiter, event.workload, event.runId ?? '', event.requestId ?? ''].join('\u0000');
    switch (event.type) {
      case 'wait-started':
        this.#waits.set(key, (this.#waits.get(key) ?? 0) + 1);
        counts.queued++;
        return;
      case 'acquired':
      case 'timed-out':
      case 'queue-full':
      case 'wait-cancelled':
      case 'limiter-error':
        if (this.#closeWait(key)) counts.queued--;
        if (event.type === 'acquired') counts.active++;
        return;
      case 'released':
      case 'lease-lost':
        counts.active = Math.max(0, counts.active - 1);
        return;
      case 'config-error':
      case 'renewal-failed':
      case 'release-failed':
      case 'provider-throttled':
      case 'limit-changed':
        return;
      default: {
        const never: never = event;
        return never;
      }
    }
  }

  /**
   * Every limiter's workloads now, from `read` (one read of the limiters' stats, shared with
   * other figures) or a read of its own. A limiter whose stats cannot be read is left out
   * rather than shown wrong.
   */
  async read(read?: StatsRead): Promise<WorkloadSlots[]> {
    const { stats, withStats } = read ?? (await readStats(this.limiters.values()));
    const out: WorkloadSlots[] = [];
    for (const [limiter, s] of stats) {
      for (const [workload, w] of Object.entries(s.workloads) as [string, Counts][])
        out.push({ limiter, workload, active: w.active, queued: w.queued, source: 'stats' });
    }
    for (const [limiter, workloads] of this.#counts) {
      if (withStats.has(limiter)) continue;
      for (const [workload, c] of workloads)
        out.push({ limiter, workload, active: c.active, queued: c.queued, source: 'events' });
    }
    return out.sort((a, b) => a.limiter.localeCompare(b.limiter) || a.workload.localeCompare(b.workload));
  }

  /** Whether requests of this process's runs wait for a slot of `limiter` now. */
  waiting(limiter: string): boolean {
    for (const counts of this.#counts.get(limiter)?.values() ?? []) if (counts.queued > 0) return true;
    return false;
  }

  #closeWait(key: string): boolean {
    const open = this.#waits.get(key) ?? 0;
    if (open === 0) return false;
    if (open === 1) this.#waits.delete(key);
    else this.#waits.set(key, open - 1);
    return true;
  }

  #countsOf(limiter: string, workload: string): Counts {
    let workloads = this.#counts.get(limiter);
    if (!workloads) this.#counts.set(limiter, (workloads = new Map()));
    let counts = workloads.get(workload);
    if (!counts) workloads.set(workload, (counts = { active: 0, queued: 0 }));
    return counts;
  }
}
