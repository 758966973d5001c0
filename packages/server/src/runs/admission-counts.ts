import type { Database, SqlClient } from '@sluice/postgres/database';
import type { Principal } from '../store/tokens.js';
import type { Refusal } from './refusal.js';
import type { TenantLimits } from './policy.js';
import type { CountedSet } from './retry-after.js';
import { firstFull, highestFitting, type CapLevel, type HighestCounts } from './caps.js';
import { reconcileCounters, type AdmissionCounters, type NewRun } from './store.js';

/**
 * What admission counts a run against: the set it enters and that set's caps, a batch's running
 * tallies of the counters, the most the counts may be for a decided batch to fit, and the
 * figures of the period limits (run quota, spend). "Room under a cap" itself is caps.ts; the
 * pipeline that decides is admission.ts.
 */

/** A run as the counts see it: who it is for, what it is, the tenant's limits. */
export interface Counted {
  who: Pick<Principal, 'project'>;
  run: NewRun;
  limits: TenantLimits;
}

/** The tenant's cap on a counted set. */
export function capOf(set: CountedSet, limits: TenantLimits): number {
  if (set === 'deferred') return limits.deferredQueued;
  if (set === 'scheduled') return limits.scheduled;
  return limits.activePerTenant;
}

/**
 * The set a new run enters, and the tenant's cap there. The twin of `sluice_admission_set`
 * (sql/015) for the state the run is born in (lifecycle.ts `bornStatus`): caps.test.ts checks it.
 */
export function setOf(
  run: Pick<NewRun, 'class' | 'schedule'>,
  limits: TenantLimits,
): { set: CountedSet; cap: number } {
  const set: CountedSet =
    run.class === 'deferred' ? 'deferred' : run.schedule !== undefined ? 'scheduled' : 'active';
  return { set, cap: capOf(set, limits) };
}

/** The project's cap on a counted set: only default-class active runs have one. */
const projectCapOf = (set: CountedSet, limits: TenantLimits) =>
  set === 'active' ? limits.activePerProject : 0;

/** The caps a run entering `set` is counted against, the tenant's first (see caps.ts `firstFull`). */
export function capLevels(
  set: CountedSet,
  limits: TenantLimits,
  counts: { tenant: number; project: number },
): CapLevel<'tenant' | 'project'>[] {
  return [
    { scope: 'tenant', cap: capOf(set, limits), count: counts.tenant },
    { scope: 'project', cap: projectCapOf(set, limits), count: counts.project },
  ];
}

const limitName = {
  active: 'max_active_runs',
  scheduled: 'max_scheduled_runs',
  deferred: 'max_queued_runs',
} as const;

/** Running tallies of one batch: the counters as read, plus the runs admitted so far. */
export class Tally {
  readonly #counts = new Map<string, Record<CountedSet, number>>();

  constructor(counters: Map<string, AdmissionCounters>) {
    for (const [project, row] of counters) {
      this.#counts.set(project, {
        active: row.default_active,
        scheduled: row.default_scheduled,
        deferred: row.deferred_waiting,
      });
    }
  }

  /** A tally of the same counts, to add to without changing this one. */
  copy(): Tally {
    const copy = new Tally(new Map());
    for (const [project, counts] of this.#counts) copy.#counts.set(project, { ...counts });
    return copy;
  }

  count(project: string, set: CountedSet): number {
    return this.#counts.get(project)?.[set] ?? 0;
  }

  /** The cap the run would go over, if any: the tenant's first, then its project's. */
  over(item: Counted): Refusal | undefined {
    const { set } = setOf(item.run, item.limits);
    if (item.limits.defaultClosed && item.run.class === 'default')
      return closedRefusal(this.count('', 'active'));
    const counts = { tenant: this.count('', set), project: this.count(item.who.project, set) };
    const full = firstFull(capLevels(set, item.limits, counts));
    if (!full) return undefined;
    return {
      kind: 'concurrency',
      scope: full.scope,
      class: item.run.class,
      limit: full.scope === 'tenant' ? limitName[set] : 'max_active_runs',
      limitValue: full.cap,
      active: full.count,
    };
  }

  add(item: Counted): void {
    const { set } = setOf(item.run, item.limits);
    for (const project of ['', item.who.project]) {
      let counts = this.#counts.get(project);
      if (!counts) this.#counts.set(project, (counts = { active: 0, scheduled: 0, deferred: 0 }));
      counts[set]++;
    }
  }
}

/** A tenant whose quota allows no default-class run: refused as at a full cap of 0, scheduled runs too. */
const closedRefusal = (active: number): Refusal => ({
  kind: 'concurrency',
  scope: 'tenant',
  class: 'default',
  limit: 'max_active_runs',
  limitValue: 0,
  active,
});

/**
 * Decides runs from counts alone, in order: each is refused by the first cap it would go over,
 * or counted in, so the runs after it see it.
 */
export function decideByCounts(tally: Tally, items: Counted[]): (Refusal | undefined)[] {
  return items.map((item) => {
    const over = tally.over(item);
    if (!over) tally.add(item);
    return over;
  });
}

/**
 * For each counter row, the most each count may be for every admitted run to fit: a run that
 * was the k-th of the batch to enter a set with cap c fits while the count is at most c - k.
 */
export function highestCounts(admitted: Counted[], projects: string[]): HighestCounts[] {
  const highest = new Map<string, Record<CountedSet, number | null>>(
    projects.map((project) => [project, { active: null, scheduled: null, deferred: null }]),
  );
  const entered = new Map<string, number>();
  const fit = (project: string, set: CountedSet, cap: number) => {
    const key = `${set}:${project}`;
    const k = (entered.get(key) ?? 0) + 1;
    entered.set(key, k);
    const bound = highestFitting(cap, k);
    if (bound === null) return;
    const row = highest.get(project)!;
    row[set] = Math.min(row[set] ?? Infinity, bound);
  };
  for (const item of admitted) {
    const { set, cap } = setOf(item.run, item.limits);
    fit('', set, cap);
    fit(item.who.project, set, projectCapOf(set, item.limits));
  }
  return [...highest].map(([project, row]) => ({ project, ...row }));
}

/**
 * Takes the tenant's admission lock for the transaction: admission under the lock and promotion
 * take it, and so does `sluice_admit_runs` (sql/016, which spells the same key), so no two of
 * them count and write one tenant's runs at once.
 */
export async function lockTenantAdmission(tx: SqlClient, tenant: string): Promise<void> {
  await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:tenant:${tenant}`]);
}

/**
 * Sets right the counters of every tenant whose deferred running count differs from its
 * deferred runs running, read in one snapshot (counts and runs change in the same transactions,
 * so a difference there is drift: a manual edit, a bulk load with triggers off). Admission sets
 * a tenant right only when the tenant admits; deferred claims trust the count, so a count that
 * drifted high would keep a tenant that admits nothing more from ever having its queued runs
 * claimed. Node upkeep calls this every `tuning.admissionReconcileMs`. Returns the tenants set right.
 */
export async function reconcileDrifted(db: Database): Promise<string[]> {
  const { rows } = await db.query<{ tenant: string }>(
    `SELECT c.tenant FROM admission_counters c
     WHERE c.project = '' AND c.deferred_running <> (
       SELECT count(*) FROM agent_runs r WHERE r.tenant = c.tenant AND r.class = 'deferred' AND r.status = 'running')`,
  );
  for (const { tenant } of rows)
    await db.transaction(async (tx) => {
      await lockTenantAdmission(tx, tenant);
      await reconcileCounters(tx, tenant);
    });
  return rows.map((r) => r.tenant);
}

export async function quotaUse(tx: SqlClient, tenant: string, windowMs: number): Promise<number> {
  return (
    await tx.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM agent_runs
       WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
      [tenant, windowMs],
    )
  ).rows[0]!.n;
}

export interface SpendFigures {
  spent: number;
  active: number;
  mean: number | null;
}

export async function spendFigures(tx: SqlClient, tenant: string, windowMs: number): Promise<SpendFigures> {
  return (
    await tx.query<SpendFigures>(
      // The gateway's requests (sql/021) spend from the same limit as the tenant's runs.
      `SELECT (coalesce(sum((usage ->> 'cost')::float8), 0) +
               (SELECT coalesce(sum(cost), 0) FROM gateway_usage
                WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'))::float8 AS spent,
              count(*) FILTER (WHERE status IN ('scheduled', 'queued', 'running', 'requires_action'))::int AS active,
              avg((usage ->> 'cost')::float8) FILTER (WHERE usage ? 'cost')::float8 AS mean
       FROM agent_runs
       WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
      [tenant, windowMs],
    )
  ).rows[0]!;
}
