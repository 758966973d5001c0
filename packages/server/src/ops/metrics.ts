import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { ConcurrencyEvent } from 'sluice';
import { runClasses, runStatuses } from '../runs/lifecycle.js';
import type { AdmissionLog } from './admissions.js';
import type { CapacityBook } from './capacity.js';
import { readStats } from './limiters.js';
import type { RunCounts } from './run-counts.js';
import type { SlotBook } from './slots.js';

/** Slot waits run from nothing (a free slot) to the longest `maxWaitMs` people set: minutes. */
const WAIT_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/**
 * The server's Prometheus metrics, on a registry of its own: two apps in one process (tests,
 * an embedding host) do not collide, and nothing leaks into prom-client's global registry.
 * Gauges are filled at scrape time from one read of the limiters and the run table; the
 * histogram and the counter are fed as things happen.
 */
export class Metrics {
  readonly registry = new Registry();
  readonly #slots: SlotBook;
  readonly #runs: RunCounts;
  readonly #slotsActive: Gauge<'limiter' | 'workload'>;
  readonly #queued: Gauge<'limiter' | 'workload'>;
  readonly #wait: Histogram<'limiter' | 'workload'>;
  readonly #runsGauge: Gauge<'class' | 'status'>;
  readonly #admissions: Counter<'class' | 'outcome'>;
  readonly #capacity: CapacityBook;
  readonly #limit: Gauge<'limiter'>;
  readonly #budgetAvailable: Gauge<'limiter' | 'budget'>;
  readonly #throttled: Counter<'limiter'>;
  #defaults = false;

  constructor(parts: { slots: SlotBook; runs: RunCounts; admissions: AdmissionLog; capacity: CapacityBook }) {
    this.#slots = parts.slots;
    this.#runs = parts.runs;
    this.#capacity = parts.capacity;
    const registers = [this.registry];
    this.#slotsActive = new Gauge({
      name: 'sluice_limiter_slots_active',
      help: 'Provider-request slots in use, per limiter and workload (a shared limiter: all processes)',
      labelNames: ['limiter', 'workload'],
      registers,
    });
    this.#queued = new Gauge({
      name: 'sluice_limiter_queued',
      help: 'Provider requests waiting for a slot, per limiter and workload (a shared limiter: all processes)',
      labelNames: ['limiter', 'workload'],
      registers,
    });
    this.#wait = new Histogram({
      name: 'sluice_limiter_wait_seconds',
      help: "How long this process's provider requests waited for the slot they got",
      labelNames: ['limiter', 'workload'],
      buckets: WAIT_BUCKETS_S,
      registers,
    });
    this.#runsGauge = new Gauge({
      name: 'sluice_runs',
      help: 'Runs in the database per class and status, all processes (ended runs recounted at most once a minute)',
      labelNames: ['class', 'status'],
      registers,
    });
    this.#admissions = new Counter({
      name: 'sluice_run_admissions_total',
      help: 'Requests for a run in this process: admitted, or the limit that refused them',
      labelNames: ['class', 'outcome'],
      registers,
    });
    for (const runClass of runClasses) this.#admissions.inc({ class: runClass, outcome: 'admitted' }, 0);
    parts.admissions.onDecision((runClass, outcome) => this.#admissions.inc({ class: runClass, outcome }));
    this.#limit = new Gauge({
      name: 'sluice_limiter_limit',
      help: "The limiter's effective concurrency limit: maxConcurrent, or lower while the adaptive limit has lowered it",
      labelNames: ['limiter'],
      registers,
    });
    this.#budgetAvailable = new Gauge({
      name: 'sluice_limiter_budget_available',
      help: 'What a grant could take now from each per-minute budget of the limiter (requests, tokens, inputTokens, outputTokens)',
      labelNames: ['limiter', 'budget'],
      registers,
    });
    this.#throttled = new Counter({
      name: 'sluice_limiter_provider_throttled_total',
      help: 'Times the provider said it was overloaded (429, 503, 529 or nothing remaining) and the limiter paused its grants, as this process heard them',
      labelNames: ['limiter'],
      registers,
    });
    // Present at 0 from the start for every limiter that reports them: a rate needs the series.
    for (const limiter of parts.capacity.counted) this.#throttled.inc({ limiter }, 0);
    parts.capacity.onThrottled((limiter) => this.#throttled.inc({ limiter }));
  }

  /** Feeds the wait histogram; pass every slot event of this process's runs. */
  observe(event: ConcurrencyEvent): void {
    if (event.type === 'acquired')
      this.#wait.observe({ limiter: event.limiter, workload: event.workload }, event.waitMs / 1000);
  }

  /** The exposition text, with the gauges read now. */
  async render(): Promise<string> {
    // Started at the first scrape: prom-client's event-loop monitor and GC observer cannot be
    // stopped, so an app that is never scraped (most apps in a test run) never starts them.
    if (!this.#defaults) {
      this.#defaults = true;
      collectDefaultMetrics({ register: this.registry });
    }
    const [stats, runs] = await Promise.all([readStats(this.#slots.limiters.values()), this.#runs.read()]);
    const slots = await this.#slots.read(stats);
    // Reset first: a workload or status that has gone must not keep its last value.
    this.#slotsActive.reset();
    this.#queued.reset();
    for (const s of slots) {
      this.#slotsActive.set({ limiter: s.limiter, workload: s.workload }, s.active);
      this.#queued.set({ limiter: s.limiter, workload: s.workload }, s.queued);
    }
    this.#limit.reset();
    this.#budgetAvailable.reset();
    for (const c of this.#capacity.read(stats)) {
      if (c.limit !== undefined) this.#limit.set({ limiter: c.limiter }, c.limit);
      for (const [budget, b] of Object.entries(c.budgets))
        this.#budgetAvailable.set({ limiter: c.limiter, budget }, b.available);
    }
    this.#runsGauge.reset();
    // Every class and status appears, at 0 when there is none: a rate or an alert needs the series.
    for (const runClass of runClasses)
      for (const status of runStatuses) this.#runsGauge.set({ class: runClass, status }, 0);
    for (const r of runs) this.#runsGauge.inc({ class: r.class, status: r.status }, r.count);
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
