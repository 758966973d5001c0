import type { SqlClient } from '@sluice/postgres/database';
import { threadHeld } from '../threads/store.js';
import type { TenantLimits } from './policy.js';
import type { RunRow } from './store.js';
import { waitingOf, type WaitingReason } from './waiting.js';

/** Waiting runs of one tenant for one reason (the dashboard's table). */
export interface WaitingCount {
  tenant: string;
  reason: WaitingReason;
  count: number;
}

interface Group {
  tenant: string;
  project: string;
  agent: string;
  class: RunRow['class'];
  status: RunRow['status'];
  future: boolean;
  thread_busy: boolean;
  count: number;
}

/**
 * Every tenant's waiting runs by reason, for the dashboard: the live runs grouped in one
 * statement (the partial index of live runs), the counters and the running deferred runs in
 * one each, then the rule of waiting.ts applied to each group.
 */
export async function waitingCounts(
  db: SqlClient,
  options: {
    tenant?: string;
    limitsFor: (tenant: string) => TenantLimits;
    deferredRunningCap: number;
    providerWaiting: (tenant: string, agent: string) => boolean;
  },
): Promise<WaitingCount[]> {
  const tenants = options.tenant === undefined ? null : [options.tenant];
  const [groups, counters, running, now] = await Promise.all([
    db.query<Group>(
      `SELECT r.tenant, r.project, r.agent, r.class, r.status,
              coalesce(r.scheduled_for > clock_timestamp(), false) AS future,
              (r.status = 'queued' AND t.id IS NOT NULL) AS thread_busy, count(*)::int AS count
       FROM agent_runs r
       LEFT JOIN threads t ON t.id = r.thread_id AND t.active_run_id IS DISTINCT FROM r.id AND ${threadHeld('t')}
       WHERE r.status IN ('queued', 'scheduled') AND ($1::text[] IS NULL OR r.tenant = ANY($1::text[]))
       GROUP BY 1, 2, 3, 4, 5, 6, 7`,
      [tenants],
    ),
    db.query<{ tenant: string; project: string; default_active: number }>(
      `SELECT tenant, project, default_active FROM admission_counters WHERE ($1::text[] IS NULL OR tenant = ANY($1::text[]))`,
      [tenants],
    ),
    db.query<{ tenant: string; n: number }>(
      `SELECT tenant, count(*)::int AS n FROM agent_runs WHERE status = 'running' AND class = 'deferred'
       GROUP BY tenant`,
    ),
    db.query<{ now: number }>('SELECT extract(epoch FROM clock_timestamp())::float8 AS now'),
  ]);
  const active = new Map(counters.rows.map((r) => [`${r.tenant}\u0000${r.project}`, r.default_active]));
  const deferred = new Map(running.rows.map((r) => [r.tenant, r.n]));
  const totals = new Map<string, WaitingCount>();
  for (const g of groups.rows) {
    const nowS = now.rows[0]!.now;
    const run = {
      id: '',
      tenant: g.tenant,
      project: g.project,
      agent: g.agent,
      class: g.class,
      status: g.status,
      // Only whether it is due matters to the rule.
      scheduled_for: g.future ? nowS + 1 : nowS,
      thread_id: g.thread_busy ? 'busy' : null,
    } as RunRow;
    const waiting = waitingOf(run, {
      now: nowS,
      limits: options.limitsFor(g.tenant),
      active: (project) => active.get(`${g.tenant}\u0000${project}`) ?? 0,
      deferredRunning: deferred.get(g.tenant) ?? 0,
      deferredRunningCap: options.deferredRunningCap,
      threadBusyFor: () => g.thread_busy,
      providerWaiting: (agent) => options.providerWaiting(g.tenant, agent),
      capWaitMs: 0,
    });
    if (!waiting) continue;
    const key = `${g.tenant}\u0000${waiting.reason}`;
    const total = totals.get(key) ?? { tenant: g.tenant, reason: waiting.reason, count: 0 };
    total.count += g.count;
    totals.set(key, total);
  }
  return [...totals.values()].sort(
    (a, b) => a.tenant.localeCompare(b.tenant) || a.reason.localeCompare(b.reason),
  );
}
