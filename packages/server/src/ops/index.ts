import type { Database } from '@sluice/postgres/database';
import { systemClock, type Clock } from '../clock.js';
import type { SluiceConfig } from '../config.js';
import type { Executor } from '../runs/executor.js';
import { AdmissionLog, type RecentRefusal } from './admissions.js';
import { CapacityBook, type LimiterCapacity } from './capacity.js';
import { readStats } from './limiters.js';
import { Metrics } from './metrics.js';
import { RunCounts, type RunCount, type RunCountsOptions } from './run-counts.js';
import { SlotBook, type WorkloadSlots } from './slots.js';
import { GatewayTraffic, type GatewayTrafficRow } from '../gateway/traffic.js';
import type { WaitingCount } from '../runs/waiting-counts.js';

export { AdmissionLog, type AdmissionHooks } from './admissions.js';

/** What the dashboard polls: every figure it draws, in one answer. */
export interface Overview {
  readonly object: 'ops.overview';
  /** When the figures were read (ISO). */
  readonly at: string;
  readonly limiters: readonly WorkloadSlots[];
  /** Each limiter's effective limit, budgets and provider throttles (limiters that report them). */
  readonly capacity: readonly LimiterCapacity[];
  readonly runs: readonly RunCount[];
  /** This process's last refusals, newest first. */
  readonly refusals: readonly RecentRefusal[];
  /** Gateway requests per tenant and gateway, as this process counted them. */
  readonly gateways: readonly GatewayTrafficRow[];
  /** Queued and scheduled runs by tenant and the reason they wait (runs/waiting.ts). */
  readonly waiting: readonly WaitingCount[];
}

export interface OpsOptions {
  runCounts?: RunCountsOptions;
  /** Refusals the dashboard lists. @default 50 */
  recentRefusals?: number;
  /** The server's clock: refusals are stamped with it. */
  clock?: Clock;
  /** Reads the waiting runs by tenant and reason (the app gives it its limits); default: none shown. */
  waiting?: (tenant?: string) => Promise<WaitingCount[]>;
}

/** The server's operating state: slot counts, run counts, admission decisions, metrics. */
export class Ops {
  readonly slots: SlotBook;
  readonly runs: RunCounts;
  readonly admissions: AdmissionLog;
  readonly capacity: CapacityBook;
  readonly metrics: Metrics;
  /** Gateway traffic per tenant (the gateway counts it, the dashboard draws it). */
  readonly gatewayTraffic = new GatewayTraffic();
  readonly #clock: Clock;
  readonly #waiting: (tenant?: string) => Promise<WaitingCount[]>;

  constructor(db: Database, config: SluiceConfig, executor: Executor, options: OpsOptions = {}) {
    this.slots = new SlotBook(config);
    this.runs = new RunCounts(db, options.runCounts);
    const clock = (this.#clock = options.clock ?? systemClock);
    this.#waiting = options.waiting ?? (async () => []);
    this.admissions = new AdmissionLog(options.recentRefusals ?? 50, () => new Date(clock.now()));
    this.capacity = new CapacityBook(this.slots.limiters);
    this.metrics = new Metrics({
      slots: this.slots,
      runs: this.runs,
      admissions: this.admissions,
      capacity: this.capacity,
    });
    executor.concurrencyListeners.add((event) => {
      this.slots.observe(event);
      this.metrics.observe(event);
    });
  }

  /**
   * The figures the dashboard draws: for one tenant when `tenant` is given (its runs and
   * refusals; the limiters are shared by all and carry no tenant), else for all.
   */
  async overview(tenant?: string): Promise<Overview> {
    const [stats, runs, waiting] = await Promise.all([
      readStats(this.slots.limiters.values()),
      this.runs.read(),
      this.#waiting(tenant),
    ]);
    const limiters = await this.slots.read(stats);
    const order = (r: RunCount) => `${r.tenant}\u0000${r.class}\u0000${r.status}`;
    const mine = <T extends { tenant: string }>(rows: T[]) =>
      tenant === undefined ? rows : rows.filter((r) => r.tenant === tenant);
    return {
      object: 'ops.overview',
      at: new Date(this.#clock.now()).toISOString(),
      limiters,
      capacity: this.capacity.read(stats),
      runs: mine(runs).sort((a, b) => order(a).localeCompare(order(b))),
      refusals: this.admissions.recent(tenant),
      gateways: this.gatewayTraffic.read(tenant),
      waiting,
    };
  }

  /** Stops listening to the limiters, which may outlive this server. */
  close(): void {
    this.capacity.close();
  }
}
