import type { Database } from '@sluice/postgres/database';
import { overCap } from './admission-counts.js';
import type { TenantLimits } from './policy.js';

/** Rows one pass moves at most, so a pass is a short transaction whatever the backlog. */
export const BATCH = 500;

/**
 * Moves due scheduled runs to their queues. Deferred ones go at once (their place in the
 * deferred queue was counted when they were accepted). Default-class ones go tenant by tenant,
 * each in its own short transaction under that tenant's admission lock, only while the tenant
 * and the run's project are under the default-class cap. A tenant at its cap therefore holds
 * back only its own runs, never another tenant's; and since one transaction takes one tenant's
 * lock, two processes promoting at once cannot deadlock. Returns how many runs moved.
 */
export async function promoteDueRuns(
  db: Database,
  limitsFor: (tenant: string) => TenantLimits,
): Promise<number> {
  const deferred = await db.query<{ id: string }>(
    `UPDATE agent_runs SET status = 'queued'
     WHERE id IN (SELECT id FROM agent_runs WHERE status = 'scheduled' AND class = 'deferred'
                    AND scheduled_for <= clock_timestamp()
                  ORDER BY scheduled_for LIMIT ${BATCH} FOR UPDATE SKIP LOCKED)
     RETURNING id`,
  );
  let promoted = deferred.rows.length;
  const tenants = (
    await db.query<{ tenant: string }>(
      `SELECT DISTINCT tenant FROM agent_runs
       WHERE status = 'scheduled' AND class = 'default' AND scheduled_for <= clock_timestamp()
       ORDER BY tenant LIMIT 1000`,
    )
  ).rows.map((r) => r.tenant);
  for (const tenant of tenants) promoted += await promoteTenant(db, tenant, limitsFor(tenant));
  return promoted;
}

async function promoteTenant(db: Database, tenant: string, limits: TenantLimits): Promise<number> {
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:tenant:${tenant}`]);
    // The tenant's active default-class runs per project, counted once. Projects at their cap
    // are left out of the due rows inside the query, so a full project's backlog never hides
    // another project's due runs behind the batch limit.
    const active = new Map(
      (
        await tx.query<{ project: string; n: number }>(
          `SELECT project, count(*)::int AS n FROM agent_runs
           WHERE tenant = $1::text AND class = 'default' AND status IN ('queued', 'running') GROUP BY project`,
          [tenant],
        )
      ).rows.map((r) => [r.project, r.n]),
    );
    let tenantCount = [...active.values()].reduce((a, n) => a + n, 0);
    if (overCap(limits, { tenant: tenantCount, project: 0 })?.scope === 'tenant') return 0;
    const full =
      limits.activePerProject > 0
        ? [...active].filter(([, n]) => n >= limits.activePerProject).map(([p]) => p)
        : [];
    const due = (
      await tx.query<{ id: string; project: string }>(
        `SELECT id, project FROM agent_runs
         WHERE tenant = $1::text AND status = 'scheduled' AND class = 'default' AND scheduled_for <= clock_timestamp()
           AND NOT (project = ANY($2::text[]))
         ORDER BY scheduled_for, seq LIMIT ${BATCH} FOR UPDATE SKIP LOCKED`,
        [tenant, full],
      )
    ).rows;
    const moving: string[] = [];
    for (const run of due) {
      const project = active.get(run.project) ?? 0;
      const over = overCap(limits, { tenant: tenantCount, project });
      if (over?.scope === 'tenant') break;
      if (over) continue;
      moving.push(run.id);
      tenantCount++;
      active.set(run.project, project + 1);
    }
    if (moving.length > 0) {
      await tx.query(`UPDATE agent_runs SET status = 'queued' WHERE id = ANY($1::text[])`, [moving]);
    }
    return moving.length;
  });
}

/**
 * Deferred runs still queued, and scheduled runs still not started, `maxWaitMs` after they
 * became due end failed with `expired`. In batches, so one pass never rewrites a whole backlog.
 */
export async function expireRuns(db: Database, maxWaitMs: number): Promise<number> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'expired', 'message', 'the run was not started within AGENT_DEFERRED_MAX_WAIT_MS')
     WHERE id IN (SELECT id FROM agent_runs
                  -- A resumed run (approvals given) is accepted work: it never expires.
                  WHERE ((status = 'queued' AND class = 'deferred' AND approvals IS NULL) OR status = 'scheduled')
                    AND coalesce(scheduled_for, created_at) < clock_timestamp() - $1::float8 * interval '1 millisecond'
                  LIMIT ${BATCH} FOR UPDATE SKIP LOCKED)
     RETURNING id`,
    [maxWaitMs],
  );
  return result.rows.length;
}
