import type { SqlClient } from '@sluice/postgres/database';
import type { Principal } from '../store/tokens.js';
import type { Refusal } from './refusal.js';
import type { TenantLimits } from './policy.js';
import type { CountedSet } from './retry-after.js';
import type { AdmissionCounters, HighestCounts, NewRun } from './store.js';

/**
 * What admission counts a run against: the set it enters and that set's cap, a batch's running
 * tallies of the counters, the most the counts may be for a decided batch to fit, and the
 * figures of the period limits (run quota, spend). The decisions themselves are in admission.ts.
 */

/** A run as the counts see it: who it is for, what it is, the tenant's limits. */
export interface Counted {
  who: Pick<Principal, 'project'>;
  run: NewRun;
  limits: TenantLimits;
}

/** The set a new run enters, and its cap there. */
export function setOf(run: NewRun, limits: TenantLimits): { set: CountedSet; cap: number } {
  if (run.class === 'deferred') return { set: 'deferred', cap: limits.deferredQueued };
  if (run.schedule !== undefined) return { set: 'scheduled', cap: limits.scheduled };
  return { set: 'active', cap: limits.activePerTenant };
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

  count(project: string, set: CountedSet): number {
    return this.#counts.get(project)?.[set] ?? 0;
  }

  /** The cap the run would go over, if any: the tenant's first, then its project's. */
  over(item: Counted): Refusal | undefined {
    const { set, cap } = setOf(item.run, item.limits);
    const cls = item.run.class;
    const tenantCount = this.count('', set);
    if (cap > 0 && tenantCount >= cap) {
      return {
        kind: 'concurrency',
        scope: 'tenant',
        class: cls,
        limit: limitName[set],
        limitValue: cap,
        active: tenantCount,
      };
    }
    const perProject = item.limits.activePerProject;
    if (set === 'active' && perProject > 0) {
      const projectCount = this.count(item.who.project, set);
      if (projectCount >= perProject) {
        return {
          kind: 'concurrency',
          scope: 'project',
          class: cls,
          limit: 'max_active_runs',
          limitValue: perProject,
          active: projectCount,
        };
      }
    }
    return undefined;
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
    if (cap <= 0) return;
    const row = highest.get(project)!;
    row[set] = Math.min(row[set] ?? Infinity, cap - k);
  };
  for (const item of admitted) {
    const { set, cap } = setOf(item.run, item.limits);
    fit('', set, cap);
    fit(item.who.project, set, set === 'active' ? item.limits.activePerProject : 0);
  }
  return [...highest].map(([project, row]) => ({ project, ...row }));
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
      `SELECT coalesce(sum((usage ->> 'cost')::float8), 0)::float8 AS spent,
              count(*) FILTER (WHERE status IN ('scheduled', 'queued', 'running', 'requires_action'))::int AS active,
              avg((usage ->> 'cost')::float8) FILTER (WHERE usage ? 'cost')::float8 AS mean
       FROM agent_runs
       WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
      [tenant, windowMs],
    )
  ).rows[0]!;
}

/** The cap a count is at, if any: the tenant's first, then the project's (promotion's check). */
export function overCap(
  limits: TenantLimits,
  counts: { tenant: number; project: number },
): { scope: 'tenant' | 'project'; limitValue: number; active: number } | undefined {
  if (limits.activePerTenant > 0 && counts.tenant >= limits.activePerTenant) {
    return { scope: 'tenant', limitValue: limits.activePerTenant, active: counts.tenant };
  }
  if (limits.activePerProject > 0 && counts.project >= limits.activePerProject) {
    return { scope: 'project', limitValue: limits.activePerProject, active: counts.project };
  }
  return undefined;
}
