import type { Database } from '@sluice/postgres/database';
import { capLevels, lockTenantAdmission } from './admission-counts.js';
import { firstFull, hasRoom } from './caps.js';
import { BATCH, promoteDueDeferredSql, queueScheduled } from './lifecycle.js';
import type { TenantLimits } from './policy.js';

/**
 * Moves due scheduled runs to their queues. Deferred ones go at once (their place in the
 * deferred queue was counted when they were accepted). Default-class ones go tenant by tenant,
 * each in its own short transaction under that tenant's admission lock, only while the tenant
 * and the run's project have room under the default-class cap. A tenant at its cap therefore
 * holds back only its own runs, never another tenant's; and since one transaction takes one
 * tenant's lock, two processes promoting at once cannot deadlock. Returns how many runs moved.
 */
export async function promoteDueRuns(
  db: Database,
  limitsFor: (tenant: string) => TenantLimits,
): Promise<number> {
  return (await promotionPass(db, limitsFor)).promoted;
}

/**
 * promoteDueRuns, also saying whether any run still waits for its time (due or not): with
 * none, the next pass can wait longer (node/upkeep.ts).
 */
export async function promotionPass(
  db: Database,
  limitsFor: (tenant: string) => TenantLimits,
): Promise<{ promoted: number; waiting: boolean }> {
  // One round trip when nothing is due (most passes): the deferred runs move, the tenants with
  // due default-class runs are listed, and whether any run waits at all, by one statement.
  const { rows } = await db.query<{ deferred: number; tenants: string[]; waiting: boolean }>(
    `WITH moved AS (${promoteDueDeferredSql})
     SELECT (SELECT count(*)::int FROM moved) AS deferred,
            ARRAY(SELECT DISTINCT tenant FROM agent_runs
                  WHERE status = 'scheduled' AND class = 'default' AND scheduled_for <= clock_timestamp()
                  ORDER BY tenant LIMIT 1000) AS tenants,
            EXISTS (SELECT 1 FROM agent_runs WHERE status = 'scheduled') AS waiting`,
  );
  const row = rows[0]!;
  let promoted = row.deferred;
  for (const tenant of row.tenants) promoted += await promoteTenant(db, tenant, limitsFor(tenant));
  // `waiting` saw the runs this statement moved (one snapshot): the next pass sees them gone.
  return { promoted, waiting: row.waiting };
}

/**
 * Of a tenant's due runs (in due order), those that enter the default-class cap now: each while
 * the tenant and its project have room (caps.ts), counting the ones chosen before it. A full
 * tenant ends the pass; a full project only skips its own runs.
 */
export function choosePromotions(
  due: readonly { id: string; project: string }[],
  active: ReadonlyMap<string, number>,
  limits: TenantLimits,
): string[] {
  const counts = new Map(active);
  let tenant = [...counts.values()].reduce((a, n) => a + n, 0);
  const moving: string[] = [];
  for (const run of due) {
    const project = counts.get(run.project) ?? 0;
    const full = firstFull(capLevels('active', limits, { tenant, project }));
    if (full?.scope === 'tenant') break;
    if (full) continue;
    moving.push(run.id);
    tenant++;
    counts.set(run.project, project + 1);
  }
  return moving;
}

async function promoteTenant(db: Database, tenant: string, limits: TenantLimits): Promise<number> {
  return db.transaction(async (tx) => {
    await lockTenantAdmission(tx, tenant);
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
    const tenantCount = [...active.values()].reduce((a, n) => a + n, 0);
    if (limits.defaultClosed || !hasRoom(tenantCount, limits.activePerTenant)) return 0;
    const full = [...active].filter(([, n]) => !hasRoom(n, limits.activePerProject)).map(([p]) => p);
    const due = (
      await tx.query<{ id: string; project: string }>(
        `SELECT id, project FROM agent_runs
         WHERE tenant = $1::text AND status = 'scheduled' AND class = 'default' AND scheduled_for <= clock_timestamp()
           AND NOT (project = ANY($2::text[]))
         ORDER BY scheduled_for, seq LIMIT ${BATCH} FOR UPDATE SKIP LOCKED`,
        [tenant, full],
      )
    ).rows;
    const moving = choosePromotions(due, active, limits);
    await queueScheduled(tx, moving);
    return moving.length;
  });
}
