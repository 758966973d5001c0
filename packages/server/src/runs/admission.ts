import type { Database } from '@sluice/postgres/database';
import type { Principal } from '../store/tokens.js';
import type { RunClass } from './lifecycle.js';
import type { TenantLimits } from './policy.js';
import { insertRun, type NewRun, type RunRow } from './store.js';
import { inTurn } from './turns.js';

/** Why a run was not admitted. The HTTP layer turns each into its 429 (see http/errors.ts). */
export type Refusal =
  | {
      kind: 'concurrency';
      scope: 'tenant' | 'project' | 'user';
      class: RunClass;
      limit: 'max_active_runs' | 'max_queued_runs' | 'max_scheduled_runs' | 'max_concurrent_per_user';
      limitValue: number;
      active: number;
    }
  | { kind: 'quota'; class: RunClass; limitValue: number; used: number }
  | { kind: 'spend'; class: RunClass; limitUsd: number; spentUsd: number; reservedUsd: number }
  /** A held run lost the thread it took before admission (its lease ran out meanwhile). */
  | { kind: 'thread'; threadId: string };

export type Admission = { ok: true; run: RunRow } | { ok: false; refusal: Refusal };

/**
 * Admits a run or refuses it before anything is written. Every count and the insert happen in
 * one transaction under the tenant's advisory lock, so concurrent requests on any server
 * process sharing the database cannot both take the last place. The lock wait is bounded by
 * the store's lock timeout: a stuck holder makes admission fail (503), not hang. Within one
 * process a tenant's admissions also take turns (see `inTurn`), so they hold few connections.
 */
export async function admitRun(
  db: Database,
  who: Principal,
  run: NewRun,
  limits: TenantLimits,
  lockWaitMs = 15_000,
  withRun?: WithRun,
): Promise<Admission> {
  return inTurn(db, who.tenant, lockWaitMs, () => admitLocked(db, who, run, limits, withRun));
}

/**
 * Written in the admitting transaction after the run (a trigger's delivery or tick row): when it
 * throws, the run is not created either.
 */
export type WithRun = (tx: { query: Database['query'] }, run: RunRow) => Promise<void>;

async function admitLocked(
  db: Database,
  who: Principal,
  run: NewRun,
  limits: TenantLimits,
  withRun?: WithRun,
): Promise<Admission> {
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:tenant:${who.tenant}`]);
    // Quota and spend first: they apply to every class. Only admitted runs are rows, so a refused
    // call costs no quota.
    if (limits.runQuota) {
      const used = (
        await tx.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs
           WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
          [who.tenant, limits.runQuota.windowMs],
        )
      ).rows[0]!.n;
      if (used >= limits.runQuota.limit) {
        return refuse({ kind: 'quota', class: run.class, limitValue: limits.runQuota.limit, used });
      }
    }
    if (limits.spend) {
      // Spend counts every run that ended in the window, whatever its state, and reserves for
      // each run still active the mean cost of the window's finished runs (or admits one run at
      // a time while no run shows what a run costs): a tenant just under
      // its limit cannot start its whole cap of runs at once. The overshoot is bounded by the
      // active runs' cost above that mean.
      const figures = (
        await tx.query<{ spent: number; active: number; mean: number | null }>(
          `SELECT coalesce(sum((usage ->> 'cost')::float8), 0)::float8 AS spent,
                  count(*) FILTER (WHERE status IN ('scheduled', 'queued', 'running', 'requires_action'))::int AS active,
                  avg((usage ->> 'cost')::float8) FILTER (WHERE usage ? 'cost')::float8 AS mean
           FROM agent_runs
           WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
          [who.tenant, limits.spend.windowMs],
        )
      ).rows[0]!;
      const reserved = figures.active * (figures.mean ?? 0);
      // With no run of the window to estimate from, a run's cost is unknown: one run at a time
      // then, until one has ended and shown what a run costs.
      const unknownCost = figures.mean === null && figures.active > 0;
      if (unknownCost || figures.spent + reserved >= limits.spend.limitUsd) {
        return refuse({
          kind: 'spend',
          class: run.class,
          limitUsd: limits.spend.limitUsd,
          spentUsd: figures.spent,
          reservedUsd: reserved,
        });
      }
    }
    if (run.class === 'deferred') {
      const queued = (
        await tx.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs
           WHERE tenant = $1::text AND class = 'deferred' AND status IN ('queued', 'scheduled')`,
          [who.tenant],
        )
      ).rows[0]!.n;
      if (limits.deferredQueued > 0 && queued >= limits.deferredQueued) {
        return refuse({
          kind: 'concurrency',
          scope: 'tenant',
          class: 'deferred',
          limit: 'max_queued_runs',
          limitValue: limits.deferredQueued,
          active: queued,
        });
      }
    } else if (run.schedule !== undefined) {
      // A scheduled default-class run counts for no cap until it is due (promotion checks then),
      // but the number waiting is bounded: parked rows are not free.
      if (limits.scheduled > 0) {
        const scheduled = (
          await tx.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1::text AND class = 'default' AND status = 'scheduled'`,
            [who.tenant],
          )
        ).rows[0]!.n;
        if (scheduled >= limits.scheduled) {
          return refuse({
            kind: 'concurrency',
            scope: 'tenant',
            class: 'default',
            limit: 'max_scheduled_runs',
            limitValue: limits.scheduled,
            active: scheduled,
          });
        }
      }
    } else {
      const counts = await activeDefaultRuns(tx, who.tenant, who.project);
      const over = overCap(limits, counts);
      if (over) return refuse({ kind: 'concurrency', class: 'default', limit: 'max_active_runs', ...over });
    }
    if (run.mode === 'inline' && run.threadId !== undefined) {
      // The thread was taken before admission, under a lease: it must still be this run's,
      // or two runs would hold it. Renewed here, it lasts until the executor renews it.
      const kept = await tx.query(
        `UPDATE threads SET lock_expires_at = greatest(lock_expires_at, clock_timestamp() + $3::float8 * interval '1 millisecond')
         WHERE id = $1::text AND active_run_id = $2::text AND lock_expires_at > clock_timestamp() RETURNING id`,
        [run.threadId, run.id, run.threadLeaseMs ?? 60_000],
      );
      if (kept.rows.length === 0) return refuse({ kind: 'thread', threadId: run.threadId });
    }
    const inserted = await insertRun(tx, who, run);
    await withRun?.(tx, inserted);
    return { ok: true as const, run: inserted };
  });
}

const refuse = (refusal: Refusal): Admission => ({ ok: false, refusal });

/** Default-class runs of a tenant (and one of its projects) that hold a place under the cap. */
export async function activeDefaultRuns(
  tx: { query: Database['query'] },
  tenant: string,
  project: string,
): Promise<{ tenant: number; project: number }> {
  return (
    await tx.query<{ tenant: number; project: number }>(
      `SELECT count(*)::int AS tenant, count(*) FILTER (WHERE project = $2::text)::int AS project
       FROM agent_runs WHERE tenant = $1::text AND class = 'default' AND status IN ('queued', 'running')`,
      [tenant, project],
    )
  ).rows[0]!;
}

/** The cap a count is at, if any: the tenant's first, then the project's. */
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
