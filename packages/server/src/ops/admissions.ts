import { systemClock } from '../clock.js';
import type { Refusal } from '../runs/admission.js';
import type { RunClass } from '../runs/lifecycle.js';

/**
 * What became of a request for a run: `admitted`, or the rule that refused it. The cap names
 * are the `limit` of the 429 body; `quota` and `spend` are the tenant's period limits, and
 * `thread_lost` a held run whose thread lease ran out before admission.
 */
export type AdmissionOutcome =
  | 'admitted'
  | 'max_active_runs'
  | 'max_queued_runs'
  | 'max_scheduled_runs'
  | 'max_concurrent_per_user'
  | 'quota'
  | 'spend'
  | 'thread_lost';

/** One refused request, as the dashboard lists it: no input, no token, no user text. */
export interface RecentRefusal {
  /** ISO time of the refusal. */
  readonly at: string;
  readonly tenant: string;
  readonly class: RunClass | 'unknown';
  readonly outcome: Exclude<AdmissionOutcome, 'admitted'>;
  readonly scope: string;
  /** The limit that was reached, and the count that reached it. */
  readonly limit: number | null;
  readonly current: number | null;
}

export function outcomeOf(refusal: Refusal): Exclude<AdmissionOutcome, 'admitted'> {
  switch (refusal.kind) {
    case 'concurrency':
      return refusal.limit;
    case 'quota':
      return 'quota';
    case 'spend':
      return 'spend';
    case 'thread':
      return 'thread_lost';
    default: {
      const never: never = refusal;
      return never;
    }
  }
}

/** Hears every admission decision of this process (see runs/submission.ts). */
export interface AdmissionHooks {
  admitted(runClass: RunClass): void;
  refused(tenant: string, refusal: Refusal): void;
}

/** A refusal as kept, its time not yet formatted. */
type Kept = Omit<RecentRefusal, 'at'> & { readonly at: Date };

/** Tenants whose own last refusals are kept; the least recently refused is dropped past it. */
const MAX_TENANTS = 1_000;

/**
 * This process's admission decisions: a count per class and outcome for the metrics, and the
 * last `size` refusals for the dashboard, of all tenants and of each one (so one tenant's storm
 * of refusals does not push another's out of that tenant's view). A refusal storm costs a
 * fixed amount of memory.
 */
export class AdmissionLog implements AdmissionHooks {
  readonly #size: number;
  readonly #recent: Kept[] = [];
  readonly #byTenant = new Map<string, Kept[]>();
  readonly #listeners = new Set<(runClass: string, outcome: AdmissionOutcome) => void>();
  readonly #now: () => Date;

  constructor(size = 50, now: () => Date = () => new Date(systemClock.now())) {
    this.#size = size;
    this.#now = now;
  }

  /** Calls `listener` on every decision; returns the unsubscribe. */
  onDecision(listener: (runClass: string, outcome: AdmissionOutcome) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  admitted(runClass: RunClass): void {
    this.#tell(runClass, 'admitted');
  }

  refused(tenant: string, refusal: Refusal): void {
    const outcome = outcomeOf(refusal);
    const runClass = refusal.kind === 'thread' ? 'unknown' : refusal.class;
    // The time is kept as a Date and shown when read: a refusal storm formats no dates.
    const entry: Kept = {
      at: this.#now(),
      tenant,
      class: runClass,
      outcome,
      scope: refusal.kind === 'concurrency' ? refusal.scope : refusal.kind === 'thread' ? 'thread' : 'tenant',
      limit:
        refusal.kind === 'concurrency' || refusal.kind === 'quota'
          ? refusal.limitValue
          : refusal.kind === 'spend'
            ? refusal.limitUsd
            : null,
      current:
        refusal.kind === 'concurrency'
          ? refusal.active
          : refusal.kind === 'quota'
            ? refusal.used
            : refusal.kind === 'spend'
              ? refusal.spentUsd + refusal.reservedUsd
              : null,
    };
    this.#keep(this.#recent, entry);
    // Map order is the recency order: re-inserted on each refusal, the first is the stalest.
    const own = this.#byTenant.get(tenant) ?? [];
    this.#byTenant.delete(tenant);
    this.#byTenant.set(tenant, own);
    this.#keep(own, entry);
    if (this.#byTenant.size > MAX_TENANTS) this.#byTenant.delete(this.#byTenant.keys().next().value!);
    this.#tell(runClass, outcome);
  }

  /** The last refusals, newest first: of all tenants, or of `tenant` alone. */
  recent(tenant?: string): RecentRefusal[] {
    const list = tenant === undefined ? this.#recent : (this.#byTenant.get(tenant) ?? []);
    return list.map((entry) => ({ ...entry, at: entry.at.toISOString() })).reverse();
  }

  #keep(list: Kept[], entry: Kept): void {
    list.push(entry);
    if (list.length > this.#size) list.splice(0, list.length - this.#size);
  }

  #tell(runClass: string, outcome: AdmissionOutcome): void {
    for (const listener of this.#listeners) listener(runClass, outcome);
  }
}
