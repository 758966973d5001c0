/**
 * The soak's checker: the run history in the database and the clients' own log, held against
 * each invariant after the load and the faults have ended and the runs have settled. Every
 * count is of violations; each comes with examples, so a failed soak says what to look at.
 *
 * The database's history is every status change of every run, recorded by a trigger the soak
 * adds to its own database (`statusHistorySql`: a soak-only table, not the product's schema),
 * with the microsecond it happened: the caps are judged from it.
 */
import pg from 'pg';
import { faultEffects, type FaultRecord } from './faults.js';
import type { Call } from './load.js';
import type { Delivery, Execution } from './receiver.js';
import { unboundedGrowth, type Samples } from './samples.js';
import type { ServerExit } from './servers.js';

/** The caps the servers were started with (the checker's view of the settings). */
export interface Caps {
  activePerTenant: number;
  /** Tenant quotas below the setting (`maxConcurrentAgentRuns`). */
  tenantQuota: Record<string, number>;
  activePerProject: number;
  deferredRunningPerTenant: number;
  /** AGENT_DEFERRED_MAX_QUEUED_PER_TENANT: deferred runs queued or scheduled per tenant. */
  deferredQueuedPerTenant: number;
  /** SLUICE_MAX_SCHEDULED_PER_TENANT: default-class runs waiting for their time per tenant. */
  scheduledPerTenant: number;
  /** SLUICE_MAX_CONCURRENT_PER_USER: held runs of one user at once. */
  perUser: number;
  /** The limiter's slots: the most requests the provider may see at once. */
  providerLimit: number;
}

/** One status change of a run (its insert included), as the soak's trigger recorded it. */
export interface StatusChange {
  runId: string;
  tenant: string;
  project: string;
  user: string;
  class: string;
  mode: string;
  threadId: string | null;
  status: string;
  /** When it happened, in milliseconds with the microseconds as a fraction. */
  at: number;
  /** The run's `started_at` after the change (a second start overwrites it). */
  startedAt: number | null;
}

export interface History {
  calls: readonly Call[];
  executions: readonly Execution[];
  deliveries: readonly Delivery[];
  faults: readonly FaultRecord[];
  changes: readonly StatusChange[];
  exits: readonly ServerExit[];
  samples: Samples;
  providerPeak: number;
}

export interface RunRow {
  id: string;
  tenant: string;
  status: string;
  callback_url: string | null;
  /** `error->>'type'` of a failed run. */
  error_type: string | null;
  /** Milliseconds (microseconds as a fraction). */
  created: number;
  finished: number | null;
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
  'callbacks_wrong_status',
  'unexpected_5xx',
  'unexpected_errors',
  'unexpected_failures',
  'not_ready_after_fault',
  'unexpected_exits',
  'unbounded_growth',
] as const;
export type Violations = Record<(typeof violationNames)[number], number>;

export interface Verdict {
  violations: Violations;
  /** Up to five examples of each violation. */
  examples: Partial<Record<keyof Violations, string[]>>;
}

export const finalStates = new Set(['succeeded', 'failed', 'canceled']);

/** Failures a run meets only when something went wrong with a process or the database. */
export const faultFailures = new Set(['timeout', 'worker_lost', 'interrupted', 'max_duration_exceeded']);

/** Error codes of a WebSocket error frame that stand for a 5xx, and the status each stands for. */
const frameStatus: Record<string, number> = {
  internal_error: 500,
  agent_run_interrupted: 503,
  server_draining: 503,
  store_unavailable: 503,
  cache_unavailable: 503,
  admission_outcome_unknown: 503,
  run_timeout: 504,
};

/** The soak's record of every status change: a table and a trigger in its own database only. */
export const statusHistorySql = `
CREATE TABLE soak_status_changes (
  seq bigserial PRIMARY KEY,
  run_id text NOT NULL,
  tenant text NOT NULL,
  project text NOT NULL,
  user_id text NOT NULL,
  class text NOT NULL,
  mode text NOT NULL,
  thread_id text,
  status text NOT NULL,
  started_at timestamptz,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION soak_record_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
     OR OLD.started_at IS DISTINCT FROM NEW.started_at THEN
    INSERT INTO soak_status_changes (run_id, tenant, project, user_id, class, mode, thread_id, status, started_at)
    VALUES (NEW.id, NEW.tenant, NEW.project, NEW.user_id, NEW.class, NEW.mode, NEW.thread_id, NEW.status, NEW.started_at);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER soak_status_changes AFTER INSERT OR UPDATE ON agent_runs
  FOR EACH ROW EXECUTE FUNCTION soak_record_status();
`;

/** A timestamp as milliseconds with its microseconds, in SQL (a JavaScript Date keeps only ms). */
const ms = (column: string) => `(extract(epoch FROM ${column}) * 1000000)::bigint::text`;
const msOf = (micros: string | null) => (micros === null ? null : Number(micros) / 1000);

export async function readRuns(url: string): Promise<RunRow[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<
      Omit<RunRow, 'created' | 'finished'> & { created: string; finished: string | null }
    >(
      `SELECT id, tenant, status, callback_url, error->>'type' AS error_type,
              ${ms('created_at')} AS created, ${ms('finished_at')} AS finished,
              (SELECT string_agg(d.state || '/' || d.attempts || '/' || coalesce(d.last_error, ''), '; ')
                 FROM callback_deliveries d WHERE d.run_id = r.id) AS deliveries
         FROM agent_runs r`,
    );
    return rows.map((row) => ({ ...row, created: msOf(row.created)!, finished: msOf(row.finished) }));
  } finally {
    await client.end();
  }
}

export async function readChanges(url: string): Promise<StatusChange[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{
      run_id: string;
      tenant: string;
      project: string;
      user_id: string;
      class: string;
      mode: string;
      thread_id: string | null;
      status: string;
      at: string;
      started_at: string | null;
    }>(
      `SELECT run_id, tenant, project, user_id, class, mode, thread_id, status,
              ${ms('at')} AS at, ${ms('started_at')} AS started_at
         FROM soak_status_changes ORDER BY at, seq`,
    );
    return rows.map((r) => ({
      runId: r.run_id,
      tenant: r.tenant,
      project: r.project,
      user: r.user_id,
      class: r.class,
      mode: r.mode,
      threadId: r.thread_id,
      status: r.status,
      at: msOf(r.at)!,
      startedAt: msOf(r.started_at),
    }));
  } finally {
    await client.end();
  }
}

const iso = (at: number) => new Date(at).toISOString();

/** A network error as the client saw it: a reset or refused connection, a stream or socket cut short. */
export const isNetworkError = (error: string | undefined) =>
  error !== undefined &&
  (error.startsWith('network:') || error.startsWith('closed_') || error === 'stream_ended_early');

export function check(history: History, runs: readonly RunRow[], caps: Caps): Verdict {
  const examples: Verdict['examples'] = {};
  const note = (name: keyof Violations, items: string[]) => {
    if (items.length > 0) examples[name] = items.slice(0, 5);
    return items.length;
  };
  const byId = new Map(runs.map((run) => [run.id, run]));
  const accepted = history.calls.filter((call) => call.runId !== undefined);
  const overlaps = (fault: FaultRecord, from: number, to: number) =>
    from <= fault.endsAt && to >= fault.startedAt;
  const inFault = (from: number, to: number) => history.faults.some((fault) => overlaps(fault, from, to));

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

  const callbacks = checkCallbacks(history, runs, byId, inFault);

  // A 5xx is a violation unless it is a 503 in the window of a fault that can cause one; a
  // network error unless it is in the window of a fault that can cause one, on its server.
  const statusOf = (call: Call) =>
    call.status === 101 && call.error !== undefined ? (frameStatus[call.error] ?? 101) : (call.status ?? 0);
  const fiveXx = history.calls.filter(
    (call) =>
      statusOf(call) >= 500 &&
      !(
        statusOf(call) === 503 &&
        history.faults.some((f) => faultEffects[f.kind].status503 && overlaps(f, call.sentAt, call.endedAt))
      ),
  );
  const networkErrors = history.calls.filter(
    (call) =>
      isNetworkError(call.error) &&
      !history.faults.some(
        (f) =>
          faultEffects[f.kind].networkErrors &&
          (f.target === undefined || f.target === call.server) &&
          overlaps(f, call.sentAt, call.endedAt),
      ),
  );
  const failures = runs.filter(
    (run) =>
      run.status === 'failed' &&
      faultFailures.has(run.error_type ?? '') &&
      !inFault(run.created, run.finished ?? Infinity),
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
      ran_twice: note('ran_twice', ranTwice(history, byId)),
      cap_exceeded: note('cap_exceeded', capsExceeded(history.changes, caps, history.faults, history.calls)),
      provider_over_limit: note(
        'provider_over_limit',
        history.providerPeak > caps.providerLimit
          ? [`the provider saw ${history.providerPeak} requests at once; the limit is ${caps.providerLimit}`]
          : [],
      ),
      callbacks_missing: note('callbacks_missing', callbacks.missing),
      callbacks_duplicated: note('callbacks_duplicated', callbacks.duplicated),
      callbacks_wrong_status: note('callbacks_wrong_status', callbacks.wrongStatus),
      unexpected_5xx: note(
        'unexpected_5xx',
        fiveXx.map(
          (c) =>
            `${c.kind} on ${c.server}: ${c.status} ${c.error ?? ''} at ${iso(c.sentAt)}-${iso(c.endedAt)}`,
        ),
      ),
      unexpected_errors: note(
        'unexpected_errors',
        networkErrors.map(
          (c) => `${c.kind} on ${c.server}: ${c.error} at ${iso(c.sentAt)}-${iso(c.endedAt)}`,
        ),
      ),
      unexpected_failures: note(
        'unexpected_failures',
        failures.map(
          (r) => `${r.id}: failed ${r.error_type} at ${iso(r.finished ?? 0)}, no fault in its life`,
        ),
      ),
      not_ready_after_fault: note(
        'not_ready_after_fault',
        history.faults.filter((f) => f.readyAt === undefined).map((f) => `${f.kind} (${f.detail})`),
      ),
      unexpected_exits: note(
        'unexpected_exits',
        history.exits.map((e) => `${e.server} (pid ${e.pid}) at ${iso(e.at)}: ${e.what}`),
      ),
      unbounded_growth: note('unbounded_growth', unboundedGrowth(history.samples)),
    },
    examples,
  };
}

/**
 * Every way a run can show it ran twice: two marks of one run, marks of one client token under
 * two runs (one call executed as two runs), a mark made after the run had ended (a process
 * went on with a run declared lost), and a run the database saw start twice.
 */
function ranTwice(history: History, byId: ReadonlyMap<string, RunRow>): string[] {
  const found: string[] = [];
  const group = (key: (e: Execution) => string) => {
    const groups = new Map<string, Execution[]>();
    for (const e of history.executions) groups.set(key(e), [...(groups.get(key(e)) ?? []), e]);
    return groups;
  };
  for (const [id, list] of group((e) => e.runId))
    if (list.length > 1)
      found.push(`${id}: executed ${list.length} times (pids ${list.map((e) => e.pid).join(', ')})`);
  for (const [token, list] of group((e) => e.token)) {
    const ids = new Set(list.map((e) => e.runId));
    if (ids.size > 1) found.push(`token ${token}: executed by ${ids.size} runs (${[...ids].join(', ')})`);
  }
  for (const e of history.executions) {
    const finished = byId.get(e.runId)?.finished;
    if (finished !== null && finished !== undefined && e.startedAt > finished)
      found.push(
        `${e.runId}: executed at ${iso(e.startedAt)} (pid ${e.pid}), after it ended at ${iso(finished)}`,
      );
  }
  const starts = new Map<string, number>();
  const last = new Map<string, StatusChange>();
  for (const c of history.changes) {
    const before = last.get(c.runId);
    const started =
      (c.status === 'running' && before?.status !== 'running') ||
      (before !== undefined &&
        c.startedAt !== null &&
        before.startedAt !== null &&
        c.startedAt !== before.startedAt);
    if (started) starts.set(c.runId, (starts.get(c.runId) ?? 0) + 1);
    last.set(c.runId, c);
  }
  for (const [id, n] of starts) if (n > 1) found.push(`${id}: started ${n} times in the database`);
  return found;
}

function checkCallbacks(
  history: History,
  runs: readonly RunRow[],
  byId: ReadonlyMap<string, RunRow>,
  inFault: (from: number, to: number) => boolean,
) {
  const byDelivery = new Map<string, Delivery[]>();
  for (const d of history.deliveries)
    byDelivery.set(d.deliveryId, [...(byDelivery.get(d.deliveryId) ?? []), d]);
  const calledBack = new Set(history.deliveries.map((d) => d.runId));
  // Every final run with a callback_url, and every run a client asked a callback for (whether
  // or not the server kept its callback_url), must have had one.
  const due = new Set(runs.filter((r) => r.callback_url && finalStates.has(r.status)).map((r) => r.id));
  for (const call of history.calls) if (call.callback && call.runId) due.add(call.runId);
  const missing = [...due]
    .filter((id) => !calledBack.has(id))
    .map((id) => {
      const run = byId.get(id);
      return `${id} (${run?.status ?? 'missing'}; callback_url ${run?.callback_url ? 'set' : 'not stored'}; stored deliveries: ${run?.deliveries ?? 'none'})`;
    });
  // A delivery may come twice when the record of its success was lost to a fault (at least
  // once): only a repeat with no fault between the two is a violation.
  const duplicated = [...byDelivery]
    .filter(([, list]) => list.length > 1 && !inFault(list[0]!.at, list[list.length - 1]!.at))
    .map(([id, list]) => `${id}: ${list.length} deliveries`);
  const wrongStatus = history.deliveries
    .filter((d) => {
      const run = byId.get(d.runId);
      return run !== undefined && d.status !== run.status;
    })
    .map((d) => `${d.runId}: called back ${d.status}, stored ${byId.get(d.runId)!.status}`);
  return { missing, duplicated, wrongStatus };
}

interface Interval {
  runId: string;
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

/** A counted set: which runs are in it, in which status, grouped how, under which cap. */
interface CountedSet {
  what: string;
  member(c: StatusChange): boolean;
  group(c: StatusChange): string;
  cap(group: string): number;
}

/**
 * Each cap from the timeline of status changes: a run is in a counted set from the change that
 * put it there to the change that took it out (a scheduled default-class run enters the tenant's
 * active set when it is promoted to queued, not before). The per-user cap counts held runs, whose
 * places live in the cache store: a Redis restart empties them until each server reconnects and
 * puts its own back (docs/server.md). A held run across a restart counts all along; a take made
 * before the places are back is not checked against them, so a held run whose call was sent in
 * a restart's gap (`RESTART_GAP_MS`) is left out of the count.
 */
/** A Redis restart's gap, around its start: a second before, ten after (or its window's end). */
export const RESTART_GAP_MS = { before: 1_000, after: 10_000 };

export function capsExceeded(
  changes: readonly StatusChange[],
  caps: Caps,
  faults: readonly FaultRecord[] = [],
  calls: readonly Call[] = [],
): string[] {
  const sets: CountedSet[] = [
    {
      what: 'tenant',
      member: (c) => c.class === 'default' && (c.status === 'queued' || c.status === 'running'),
      group: (c) => c.tenant,
      cap: (tenant) => Math.min(caps.activePerTenant, caps.tenantQuota[tenant] ?? Infinity),
    },
    {
      what: 'project',
      member: (c) => c.class === 'default' && (c.status === 'queued' || c.status === 'running'),
      group: (c) => `${c.tenant}/${c.project}`,
      cap: () => caps.activePerProject,
    },
    {
      what: 'deferred queued of tenant',
      member: (c) => c.class === 'deferred' && (c.status === 'queued' || c.status === 'scheduled'),
      group: (c) => c.tenant,
      cap: () => caps.deferredQueuedPerTenant,
    },
    {
      what: 'deferred running of tenant',
      member: (c) => c.class === 'deferred' && c.status === 'running',
      group: (c) => c.tenant,
      cap: () => caps.deferredRunningPerTenant,
    },
    {
      what: 'thread',
      member: (c) => c.threadId !== null && c.status === 'running',
      group: (c) => c.threadId!,
      cap: () => 1,
    },
    {
      what: 'user',
      member: (c) => c.mode === 'inline' && c.status === 'running',
      group: (c) => `${c.tenant}/${c.user}`,
      cap: () => caps.perUser,
    },
    {
      what: 'scheduled of tenant',
      member: (c) => c.class === 'default' && c.status === 'scheduled',
      group: (c) => c.tenant,
      cap: () => caps.scheduledPerTenant,
    },
  ];
  const byRun = new Map<string, StatusChange[]>();
  for (const c of changes) byRun.set(c.runId, [...(byRun.get(c.runId) ?? []), c]);
  const intervals = new Map<string, Interval[]>(sets.map((s) => [s.what, []]));
  for (const list of byRun.values()) {
    list.sort((a, b) => a.at - b.at);
    for (const set of sets) {
      let openAt: number | undefined;
      for (const c of list) {
        const member = set.member(c);
        if (member && openAt === undefined) openAt = c.at;
        else if (!member && openAt !== undefined) {
          intervals.get(set.what)!.push({ runId: c.runId, group: set.group(c), start: openAt, end: c.at });
          openAt = undefined;
        }
      }
      if (openAt !== undefined)
        intervals
          .get(set.what)!
          .push({ runId: list[0]!.runId, group: set.group(list[0]!), start: openAt, end: Infinity });
    }
  }
  // A restart's gap: from a moment before it (a call sent then may take its place after it) to
  // when every server has surely reconnected and put its places back.
  const gaps = faults
    .filter((f) => f.kind === 'redis_restart')
    .map((f) => ({
      from: f.startedAt - RESTART_GAP_MS.before,
      to: Math.max(f.endsAt, f.startedAt + RESTART_GAP_MS.after),
    }));
  const sentAt = new Map(calls.flatMap((c) => (c.runId === undefined ? [] : [[c.runId, c.sentAt] as const])));
  intervals.set(
    'user',
    intervals.get('user')!.filter((i) => {
      const sent = sentAt.get(i.runId) ?? i.start;
      return !gaps.some((gap) => sent >= gap.from && sent <= gap.to);
    }),
  );
  const found: string[] = [];
  for (const set of sets) {
    for (const [group, { peak, at }] of peaks(intervals.get(set.what)!)) {
      const cap = set.cap(group);
      if (cap > 0 && peak > cap) found.push(`${set.what} ${group}: ${peak} at ${iso(at)}, cap ${cap}`);
    }
  }
  return found;
}
