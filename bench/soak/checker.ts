/**
 * The soak's checker: the run history in the database and the clients' own log, held against
 * each invariant after the load and the faults have ended and the runs have settled. Every
 * count is of violations; each comes with examples, so a failed soak says what to look at.
 */
import pg from 'pg';
import type { FaultRecord } from './faults.js';
import type { Call } from './load.js';
import type { Delivery, Execution } from './receiver.js';
import { unboundedGrowth, type Samples } from './samples.js';

/** The caps the servers were started with (the checker's view of the settings). */
export interface Caps {
  activePerTenant: number;
  /** Tenant quotas below the setting (`maxConcurrentAgentRuns`). */
  tenantQuota: Record<string, number>;
  activePerProject: number;
  deferredRunningPerTenant: number;
  /** The limiter's slots: the most requests the provider may see at once. */
  providerLimit: number;
}

export interface History {
  calls: readonly Call[];
  executions: readonly Execution[];
  deliveries: readonly Delivery[];
  faults: readonly FaultRecord[];
  samples: Samples;
  providerPeak: number;
}

export interface RunRow {
  id: string;
  tenant: string;
  project: string;
  class: string;
  status: string;
  thread_id: string | null;
  callback_url: string | null;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
  scheduled_for: Date | null;
  /** The run's callback deliveries as stored (`state/attempts/last error`), to explain a missing one. */
  deliveries?: string | null;
}

export const violationNames = [
  'lost_runs',
  'two_final_states',
  'ran_twice',
  'cap_exceeded',
  'provider_over_limit',
  'callbacks_missing',
  'callbacks_duplicated',
  'unexpected_5xx',
  'not_ready_after_fault',
  'unbounded_growth',
] as const;
export type Violations = Record<(typeof violationNames)[number], number>;

export interface Verdict {
  violations: Violations;
  /** Up to five examples of each violation. */
  examples: Partial<Record<keyof Violations, string[]>>;
}

export const finalStates = new Set(['succeeded', 'failed', 'canceled']);

export async function readRuns(url: string): Promise<RunRow[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<RunRow>(
      `SELECT id, tenant, project, class, status, thread_id, callback_url, created_at, started_at,
              finished_at, scheduled_for,
              (SELECT string_agg(d.state || '/' || d.attempts || '/' || coalesce(d.last_error, ''), '; ')
                 FROM callback_deliveries d WHERE d.run_id = r.id) AS deliveries
         FROM agent_runs r`,
    );
    return rows;
  } finally {
    await client.end();
  }
}

export function check(history: History, runs: readonly RunRow[], caps: Caps): Verdict {
  const examples: Verdict['examples'] = {};
  const note = (name: keyof Violations, items: string[]) => {
    if (items.length > 0) examples[name] = items.slice(0, 5);
    return items.length;
  };
  const byId = new Map(runs.map((run) => [run.id, run]));
  const accepted = history.calls.filter((call) => call.runId !== undefined);
  const inFault = (from: number, to: number) =>
    history.faults.some((fault) => from <= fault.endsAt && to >= fault.startedAt);

  const lost = accepted.filter((call) => !finalStates.has(byId.get(call.runId!)?.status ?? 'missing'));
  const changed = accepted.filter((call) => {
    const run = byId.get(call.runId!);
    return (
      call.final !== undefined &&
      run !== undefined &&
      finalStates.has(run.status) &&
      run.status !== call.final
    );
  });
  const marks = new Map<string, Execution[]>();
  for (const e of history.executions) marks.set(e.runId, [...(marks.get(e.runId) ?? []), e]);
  const twice = [...marks].filter(([, list]) => list.length > 1);

  const delivered = new Map<string, Delivery[]>();
  for (const d of history.deliveries)
    delivered.set(d.deliveryId, [...(delivered.get(d.deliveryId) ?? []), d]);
  const runsCalledBack = new Set(history.deliveries.map((d) => d.runId));
  const missing = runs.filter(
    (run) => run.callback_url && finalStates.has(run.status) && !runsCalledBack.has(run.id),
  );
  // A delivery may come twice when the record of its success was lost to a fault (at least
  // once): only a repeat with no fault between the two is a violation.
  const duplicated = [...delivered].filter(
    ([, list]) => list.length > 1 && !inFault(list[0]!.at, list[list.length - 1]!.at),
  );

  const fiveXx = history.calls.filter(
    (call) => (call.status ?? 0) >= 500 && !(call.status === 503 && inFault(call.sentAt, call.endedAt)),
  );

  return {
    violations: {
      lost_runs: note(
        'lost_runs',
        lost.map((c) => `${c.kind} ${c.runId}: ${byId.get(c.runId!)?.status ?? 'missing'}`),
      ),
      two_final_states: note(
        'two_final_states',
        changed.map((c) => `${c.kind} ${c.runId}: told ${c.final}, stored ${byId.get(c.runId!)!.status}`),
      ),
      ran_twice: note(
        'ran_twice',
        twice.map(
          ([id, list]) => `${id}: executed ${list.length} times (pids ${list.map((e) => e.pid).join(', ')})`,
        ),
      ),
      cap_exceeded: note('cap_exceeded', capsExceeded(runs, caps)),
      provider_over_limit: note(
        'provider_over_limit',
        history.providerPeak > caps.providerLimit
          ? [`the provider saw ${history.providerPeak} requests at once; the limit is ${caps.providerLimit}`]
          : [],
      ),
      callbacks_missing: note(
        'callbacks_missing',
        missing.map((run) => `${run.id} (${run.status}; stored deliveries: ${run.deliveries ?? 'none'})`),
      ),
      callbacks_duplicated: note(
        'callbacks_duplicated',
        duplicated.map(([id, list]) => `${id}: ${list.length} deliveries`),
      ),
      unexpected_5xx: note(
        'unexpected_5xx',
        fiveXx.map(
          (c) =>
            `${c.kind} on ${c.server}: ${c.status} ${c.error ?? ''} at ${new Date(c.sentAt).toISOString()}`,
        ),
      ),
      not_ready_after_fault: note(
        'not_ready_after_fault',
        history.faults.filter((f) => f.readyAt === undefined).map((f) => `${f.kind} (${f.detail})`),
      ),
      unbounded_growth: note('unbounded_growth', unboundedGrowth(history.samples)),
    },
    examples,
  };
}

interface Interval {
  group: string;
  start: number;
  end: number;
}

/** The most intervals of one group open at one instant (an end at t comes before a start at t). */
function peaks(intervals: readonly Interval[]): Map<string, { peak: number; at: number }> {
  const points = intervals.flatMap((i) => [
    { group: i.group, at: i.start, delta: 1 },
    { group: i.group, at: i.end, delta: -1 },
  ]);
  points.sort((a, b) => a.at - b.at || a.delta - b.delta);
  const open = new Map<string, number>();
  const result = new Map<string, { peak: number; at: number }>();
  for (const p of points) {
    const now = (open.get(p.group) ?? 0) + p.delta;
    open.set(p.group, now);
    if (now > (result.get(p.group)?.peak ?? 0)) result.set(p.group, { peak: now, at: p.at });
  }
  return result;
}

const time = (date: Date | null, fallback: number) => (date ? date.getTime() : fallback);

/**
 * Each cap from the timeline of the stored runs. A default-class run is active from its admission
 * (`created_at`) to its end; a scheduled one only from its start (when it was promoted is not
 * stored, and its start is no earlier), so the check never counts a run active before it was.
 */
export function capsExceeded(runs: readonly RunRow[], caps: Caps): string[] {
  const now = Date.now();
  const found: string[] = [];
  const judge = (what: string, intervals: Interval[], capOf: (group: string) => number) => {
    for (const [group, { peak, at }] of peaks(intervals)) {
      const cap = capOf(group);
      if (cap > 0 && peak > cap)
        found.push(`${what} ${group}: ${peak} at ${new Date(at).toISOString()}, cap ${cap}`);
    }
  };
  const active = runs
    .filter((r) => r.class === 'default')
    .map((r) => ({ run: r, start: r.scheduled_for ? r.started_at : r.created_at }))
    .filter(({ start }) => start !== null);
  judge(
    'tenant',
    active.map(({ run, start }) => ({
      group: run.tenant,
      start: start!.getTime(),
      end: time(run.finished_at, now),
    })),
    (tenant) => Math.min(caps.activePerTenant, caps.tenantQuota[tenant] ?? Infinity),
  );
  judge(
    'project',
    active.map(({ run, start }) => ({
      group: `${run.tenant}/${run.project}`,
      start: start!.getTime(),
      end: time(run.finished_at, now),
    })),
    () => caps.activePerProject,
  );
  const started = runs.filter((r) => r.started_at !== null);
  judge(
    'deferred running of tenant',
    started
      .filter((r) => r.class === 'deferred')
      .map((r) => ({ group: r.tenant, start: r.started_at!.getTime(), end: time(r.finished_at, now) })),
    () => caps.deferredRunningPerTenant,
  );
  judge(
    'thread',
    started
      .filter((r) => r.thread_id !== null)
      .map((r) => ({ group: r.thread_id!, start: r.started_at!.getTime(), end: time(r.finished_at, now) })),
    () => 1,
  );
  return found;
}
