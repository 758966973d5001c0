/**
 * The state admission keeps per database handle and tenant (runs/admission.ts): the runs waiting
 * for their tenant's next batch, the counts this process expects from its last read of the
 * counters and what it admitted since, and the departures that estimate a refusal's Retry-After.
 */
import type { Database } from '@sluice/postgres/database';
import type { Clock } from 'sluice/concurrency';
import type { Principal } from '../store/tokens.js';
import { Tally } from './admission-counts.js';
import type { TenantLimits } from './policy.js';
import type { Refusal } from './refusal.js';
import { DepartureHistory } from './retry-after.js';
import type { AdmissionCounters, NewRun, RunRow } from './store.js';

export type Admission = { ok: true; run: RunRow } | { ok: false; refusal: Refusal };

/**
 * Written in the admitting transaction after the run (a trigger's delivery or tick row): when it
 * throws, the run is not created either. A unique violation there fails only its own run: the
 * batch is then retried one run at a time (see `admitBatch`).
 */
export type WithRun = (tx: { query: Database['query'] }, run: RunRow) => Promise<void>;

export interface Pending {
  who: Principal;
  run: NewRun;
  limits: TenantLimits;
  withRun?: WithRun;
  resolve(admission: Admission): void;
  reject(error: unknown): void;
}

export interface Line {
  queue: Pending[];
  /** A turn is asked for and has not come yet: it will take the queue. */
  turnAsked: boolean;
  history: DepartureHistory;
  reconciledAt: number | undefined;
  /**
   * The counts this process expects: the last read, plus the runs it admitted since (runs that
   * ended meanwhile are not taken off). Lets a batch be written without a read first, and a
   * held run start early; the statement itself checks the true counts under the lock.
   */
  expected: Tally | undefined;
  /** The projects the last read covered (with the tenant's row ''): `expected` knows only these. */
  readProjects: ReadonlySet<string>;
  /** When the counters were last read (clock time), for the read made beside admissions. */
  observedAt: number | undefined;
  /** Reads started, numbered: a read that answers after a later one was observed is dropped. */
  reads: number;
  observedRead: number;
}

/** Per database handle, per tenant: admissions waiting for a batch, and what their reads saw. */
const lines = new WeakMap<Database, Map<string, Line>>();

export function lineOf(db: Database, tenant: string): Line {
  let tenants = lines.get(db);
  if (!tenants) lines.set(db, (tenants = new Map()));
  let line = tenants.get(tenant);
  if (!line) {
    // Bounded: tenant names come from tokens. Losing a history only costs an estimate.
    if (tenants.size >= 10_000) {
      for (const [name, l] of tenants) if (l.queue.length === 0) tenants.delete(name);
    }
    tenants.set(
      tenant,
      (line = {
        queue: [],
        turnAsked: false,
        history: new DepartureHistory(),
        reconciledAt: undefined,
        expected: undefined,
        readProjects: new Set(),
        observedAt: undefined,
        reads: 0,
        observedRead: 0,
      }),
    );
  }
  return line;
}

/** The tenant's line, if this process has admitted for it on this handle. */
export const existingLine = (db: Database, tenant: string): Line | undefined => lines.get(db)?.get(tenant);

/** Takes a read of the tenant's counters as what the process expects, and into the departure history. */
export function observe(
  line: Line,
  counters: Map<string, AdmissionCounters>,
  projects: string[],
  clock: Clock,
  read: number,
) {
  // A read that answers after a later one was observed knows less than what is there.
  if (read < line.observedRead) return;
  line.observedRead = read;
  line.expected = new Tally(counters);
  line.readProjects = new Set(['', ...projects]);
  line.observedAt = clock.now();
  const row = counters.get('');
  line.history.record({
    at: clock.now(),
    counts: {
      active: row?.default_active ?? 0,
      scheduled: row?.default_scheduled ?? 0,
      deferred: row?.deferred_waiting ?? 0,
    },
    left: {
      active: Number(row?.active_left ?? 0),
      scheduled: Number(row?.scheduled_left ?? 0),
      deferred: Number(row?.deferred_left ?? 0),
    },
  });
}

/** A refusal of a cap, with how long the tenant's runs of that set stay (its Retry-After). */
export function withEstimate(line: Line, refusal: Refusal): Refusal {
  if (refusal.kind !== 'concurrency') return refusal;
  const set =
    refusal.limit === 'max_queued_runs'
      ? 'deferred'
      : refusal.limit === 'max_scheduled_runs'
        ? 'scheduled'
        : 'active';
  return { ...refusal, retryAfterMs: line.history.estimate(set) };
}

/** A held run: executed by the process that admits it, never claimed from a queue. */
export const isHeld = (item: Pick<Pending, 'run'>) =>
  item.run.mode === 'inline' && item.run.schedule === undefined;

/** A run whose admission the counters alone decide: no quota, spend, thread or extra write. */
export const decidedByCounts = (item: Pick<Pending, 'run' | 'limits' | 'withRun'>) =>
  !item.limits.runQuota &&
  !item.limits.spend &&
  !item.withRun &&
  !(item.run.mode === 'inline' && item.run.threadId !== undefined);
