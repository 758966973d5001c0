import type { SqlClient } from '@sluice/postgres/database';
import { threadHeld } from '../threads/store.js';
import { hasRoom } from './caps.js';
import { capLevels } from './admission-counts.js';
import type { TenantLimits } from './policy.js';
import { readCounters, type RunRow } from './store.js';

/**
 * Why a queued or scheduled run has not started, from what admission and the claims already
 * count (no scan of the queue). In order, the first that holds:
 *
 *   scheduled, not due yet                           schedule     (estimated_start_at: its time)
 *   scheduled, due, default class, tenant at its cap tenant_cap   (promotion waits for room)
 *   ... or its project at its cap                    project_cap
 *   queued, its thread held by another run           thread
 *   queued deferred, tenant at its running cap       deferred_running_cap
 *   queued, its agent's provider requests waiting    provider_slot
 *   otherwise                                        worker       (every queue worker is busy)
 *
 * A due scheduled run with room is about to be promoted: it waits for `worker` too. A running,
 * paused or final run has no `waiting`.
 */
export const waitingReasons = [
  'schedule',
  'tenant_cap',
  'project_cap',
  'deferred_running_cap',
  'worker',
  'thread',
  'provider_slot',
] as const;
export type WaitingReason = (typeof waitingReasons)[number];

export interface Waiting {
  reason: WaitingReason;
  /** Epoch seconds, like the run's times; only where there is a basis for one. */
  estimated_start_at?: number;
}

/** What the rule reads, for one tenant: the counters and the few facts beside them. */
export interface WaitingFacts {
  /** Epoch seconds now (the database's clock). */
  now: number;
  limits: TenantLimits;
  /** Default-class active runs (queued + running): '' for the tenant, else per project. */
  active: (project: string) => number;
  deferredRunning: number;
  deferredRunningCap: number;
  /** Threads held by a run other than `runId`. */
  threadBusyFor: (threadId: string, runId: string) => boolean;
  providerWaiting: (agent: string) => boolean;
  /** How long a place under the tenant's default-class cap takes to free (the Retry-After estimate). */
  capWaitMs: number;
}

/** The rule above, for one run; undefined when it does not wait. */
export function waitingOf(run: RunRow, facts: WaitingFacts): Waiting | undefined {
  if (run.status === 'scheduled') {
    if (run.scheduled_for !== null && run.scheduled_for > facts.now) {
      return { reason: 'schedule', estimated_start_at: Math.floor(run.scheduled_for) };
    }
    if (run.class === 'default') {
      const full = capLevels('active', facts.limits, {
        tenant: facts.active(''),
        project: facts.active(run.project),
      }).find((level) => !hasRoom(level.count, level.cap));
      if (full) {
        return {
          reason: full.scope === 'tenant' ? 'tenant_cap' : 'project_cap',
          estimated_start_at: Math.ceil(facts.now + facts.capWaitMs / 1000),
        };
      }
    }
    return { reason: 'worker' };
  }
  if (run.status !== 'queued') return undefined;
  if (run.thread_id !== null && facts.threadBusyFor(run.thread_id, run.id)) return { reason: 'thread' };
  if (run.class === 'deferred' && !hasRoom(facts.deferredRunning, facts.deferredRunningCap))
    return { reason: 'deferred_running_cap' };
  if (facts.providerWaiting(run.agent)) return { reason: 'provider_slot' };
  return { reason: 'worker' };
}

export const waits = (run: Pick<RunRow, 'status'>) => run.status === 'queued' || run.status === 'scheduled';

/**
 * The facts for `runs` of one tenant, in at most three small reads, made only when a run
 * waits: the tenant's counter rows, the running deferred runs of the tenant (few: at most the
 * workers of all processes), and the threads the queued runs name.
 */
export async function readWaitingFacts(
  db: SqlClient,
  tenant: string,
  runs: readonly RunRow[],
  rest: Pick<WaitingFacts, 'limits' | 'deferredRunningCap' | 'providerWaiting' | 'capWaitMs'>,
): Promise<WaitingFacts> {
  const waiting = runs.filter(waits);
  const projects = [...new Set(waiting.map((r) => r.project))];
  const threadIds = [
    ...new Set(waiting.flatMap((r) => (r.status === 'queued' && r.thread_id ? [r.thread_id] : []))),
  ];
  const needDeferred = waiting.some((r) => r.class === 'deferred' && r.status === 'queued');
  const [counters, now, deferredRunning, holders] = await Promise.all([
    readCounters(db, tenant, projects),
    db.query<{ now: number }>('SELECT extract(epoch FROM clock_timestamp())::float8 AS now'),
    needDeferred
      ? db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1::text AND class = 'deferred' AND status = 'running'`,
          [tenant],
        )
      : undefined,
    threadIds.length > 0
      ? db.query<{ id: string; active_run_id: string }>(
          `SELECT t.id, t.active_run_id FROM threads t WHERE t.id = ANY($1::text[]) AND ${threadHeld('t')}`,
          [threadIds],
        )
      : undefined,
  ]);
  const holder = new Map((holders?.rows ?? []).map((r) => [r.id, r.active_run_id]));
  return {
    ...rest,
    now: now.rows[0]!.now,
    active: (project) => counters.get(project)?.default_active ?? 0,
    deferredRunning: deferredRunning?.rows[0]?.n ?? 0,
    threadBusyFor: (threadId, runId) => {
      const by = holder.get(threadId);
      return by !== undefined && by !== runId;
    },
  };
}
