import type { Database, SqlClient } from '@sluice/postgres/database';
import { finalStatuses, sqlList, type RunClass, type RunStatus } from './states.js';
import { randomId } from '../store/ids.js';
import type { RequiredAction } from './required-action.js';

/**
 * The run row and the statements that read runs: one run, a page, the admission counters, the
 * queue figures. Statements that move a run from one state to another are in lifecycle.ts. Times
 * are read in the database's clock (`clock_timestamp()`), so several server processes agree on
 * due times and expiry.
 */

export interface RunRow {
  id: string;
  tenant: string;
  project: string;
  user_id: string;
  agent: string;
  class: RunClass;
  mode: 'inline' | 'queued';
  status: RunStatus;
  /** Absent in list rows: pages stay small whatever the runs hold. */
  input?: unknown;
  output?: unknown;
  error: { type: string; message: string } | null;
  metadata: unknown;
  usage: unknown;
  created_at: number;
  started_at: number | null;
  finished_at: number | null;
  scheduled_for: number | null;
  callback_url: string | null;
  worker: string | null;
  thread_id: string | null;
  /** The run's bounds as admitted (see RunConfig). */
  config: RunConfig | null;
  /** How the OpenAI endpoints were asked for it (null for runs of the runs API). */
  api_request: Record<string, unknown> | null;
  /** Microseconds since the epoch: the page cursor's first half. */
  created_us: string;
  /** While paused: what the run waits for (see runs/required-action.ts). */
  required_action: RequiredAction | null;
  /** Resumed after a pause and not finished: the executor continues it from its paused state. */
  resuming: boolean;
}

const summary = `id, tenant, project, user_id, agent, class, mode, status, error, metadata, usage,
  (extract(epoch FROM created_at))::float8 AS created_at, (extract(epoch FROM started_at))::float8 AS started_at,
  (extract(epoch FROM finished_at))::float8 AS finished_at, (extract(epoch FROM scheduled_for))::float8 AS scheduled_for,
  callback_url, worker, thread_id, config, api_request, (extract(epoch FROM created_at) * 1000000)::bigint::text AS created_us,
  required_action, approvals IS NOT NULL AS resuming`;
export const full = `${summary}, input, output`;

const runIdPattern = /^run_[0-9a-f]{24}$/;
/** Ids are ours: anything else names no run, and costs no query. */
export const isRunId = (id: string) => runIdPattern.test(id);

/** A run as the API shows it. List rows carry no `input` or `output`. */
export function toApiRun(run: RunRow) {
  return {
    id: run.id,
    object: 'agent.run',
    agent: run.agent,
    class: run.class,
    status: run.status,
    ...('input' in run ? { input: run.input, output: run.output ?? null } : {}),
    error: run.error,
    metadata: run.metadata,
    usage: run.usage,
    created_at: Math.floor(run.created_at),
    started_at: run.started_at === null ? null : Math.floor(run.started_at),
    finished_at: run.finished_at === null ? null : Math.floor(run.finished_at),
    scheduled_for: run.scheduled_for === null ? null : Math.floor(run.scheduled_for),
    thread_id: run.thread_id,
    ...(run.required_action ? { required_action: run.required_action } : {}),
  };
}
export type ApiRun = ReturnType<typeof toApiRun>;

/**
 * The bounds a run was admitted with. `timeout_ms` is the held-run timeout (inline and
 * streamed runs); queued runs are bounded by AGENT_BACKGROUND_MAX_DURATION_MS alone.
 */
export interface RunConfig {
  timeout_ms?: number;
  tool_timeout_ms?: number;
  turn_timeout_ms?: number;
  max_parallel_tool_calls?: number;
}

export interface NewRun {
  /** Set when the id had to be known before admission (the thread lock is taken under it). */
  id?: string;
  agent: string;
  class: RunClass;
  mode: 'inline' | 'queued';
  input: unknown;
  metadata: unknown;
  /** The process that executes an inline run. */
  worker: string;
  /** When the run becomes due: an absolute time (epoch ms) or a delay from now; undefined: now. */
  schedule?: { atMs: number } | { delayMs: number };
  callbackUrl?: string;
  threadId?: string;
  /** The lease a held run's thread is kept under from admission on. */
  threadLeaseMs?: number;
  config?: RunConfig;
  apiRequest?: Record<string, unknown>;
}

export const newRunId = () => randomId('run_', 12);

/** A tenant's admission counters (see sql/015_admission_counters.sql); project '' is the whole tenant. */
export interface AdmissionCounters {
  project: string;
  default_active: number;
  default_scheduled: number;
  deferred_waiting: number;
  /** Runs that ever left each set, as text (bigint). */
  active_left: string;
  scheduled_left: string;
  deferred_left: string;
}

/** The tenant's row and its projects' rows; a tenant or project with no row has none counted yet. */
export async function readCounters(
  db: SqlClient,
  tenant: string,
  projects: string[],
): Promise<Map<string, AdmissionCounters>> {
  const rows = (
    await db.query<AdmissionCounters>(
      `SELECT project, default_active, default_scheduled, deferred_waiting, active_left, scheduled_left, deferred_left
       FROM admission_counters WHERE tenant = $1::text AND project = ANY($2::text[])`,
      [tenant, ['', ...projects]],
    )
  ).rows;
  return new Map(rows.map((r) => [r.project, r]));
}

/** Sets a tenant's counters to the true counts (under its admission lock); returns the rows it fixed. */
export async function reconcileCounters(tx: SqlClient, tenant: string): Promise<number> {
  return (
    await tx.query<{ fixed: number }>('SELECT sluice_reconcile_admission_counters($1::text) AS fixed', [
      tenant,
    ])
  ).rows[0]!.fixed;
}

export async function getRun(db: SqlClient, tenant: string, id: string): Promise<RunRow | undefined> {
  if (!isRunId(id)) return undefined;
  return (
    await db.query<RunRow>(`SELECT ${full} FROM agent_runs WHERE id = $1::text AND tenant = $2::text`, [
      id,
      tenant,
    ])
  ).rows[0];
}

/** A page cursor: opaque to clients, meaningful only inside one tenant's runs. */
export interface RunCursor {
  createdUs: string;
  id: string;
}

export function encodeCursor(run: RunRow): string {
  return Buffer.from(`${run.created_us}:${run.id}`).toString('base64url');
}

export function decodeCursor(raw: string): RunCursor | undefined {
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(raw)) return undefined;
  const match = /^(\d{1,17}):([A-Za-z0-9_]{1,100})$/.exec(Buffer.from(raw, 'base64url').toString());
  return match ? { createdUs: match[1]!, id: match[2]! } : undefined;
}

export async function listRuns(
  db: Database,
  tenant: string,
  filter: { statuses?: string[]; class?: string; limit: number; after?: RunCursor },
): Promise<RunRow[]> {
  return (
    await db.query<RunRow>(
      `SELECT ${summary} FROM agent_runs
       WHERE tenant = $1::text AND ($2::text[] IS NULL OR status = ANY($2::text[])) AND ($3::text IS NULL OR class = $3::text)
         AND ($4::bigint IS NULL OR (created_at, id) > (to_timestamp($4::bigint / 1000000.0), $5::text))
       ORDER BY created_at, id LIMIT $6::int`,
      [
        tenant,
        filter.statuses ?? null,
        filter.class ?? null,
        filter.after?.createdUs ?? null,
        filter.after?.id ?? null,
        filter.limit,
      ],
    )
  ).rows;
}

/**
 * Of the runs this process executes, those it must stop: canceled from elsewhere, or no longer
 * its own (declared `worker_lost` by a peer, or ended by someone else).
 */
export async function runsToStop(
  db: Database,
  worker: string,
  ids: string[],
): Promise<{ id: string; reason: 'cancel' | 'lost' }[]> {
  return (
    await db.query<{ id: string; reason: 'cancel' | 'lost' }>(
      `SELECT i.id, CASE WHEN r.id IS NULL OR r.status <> 'running' OR r.worker IS DISTINCT FROM $1::text THEN 'lost'
                         ELSE 'cancel' END AS reason
       FROM unnest($2::text[]) AS i(id) LEFT JOIN agent_runs r ON r.id = i.id
       WHERE r.id IS NULL OR r.status <> 'running' OR r.worker IS DISTINCT FROM $1::text OR r.cancel_requested_at IS NOT NULL`,
      [worker, ids],
    )
  ).rows;
}

/** Of these runs, the ones in a final state (the shared look of waiting callers). */
export async function endedAmong(db: Database, ids: string[]): Promise<string[]> {
  return (
    await db.query<{ id: string }>(
      `SELECT id FROM agent_runs WHERE id = ANY($1::text[]) AND status IN (${sqlList(finalStatuses)})`,
      [ids],
    )
  ).rows.map((r) => r.id);
}

/** Queue figures for the queue endpoint: tenant-wide, and for one project. */
export async function queueCounts(db: Database, tenant: string, project: string) {
  const rows = (
    await db.query<{ class: string; status: string; mine: boolean; n: number; oldest: number | null }>(
      `SELECT class, status, project = $2::text AS mine, count(*)::int AS n,
              -- A scheduled run was waiting only from when it became due.
              (extract(epoch FROM min(coalesce(scheduled_for, created_at))))::float8 AS oldest
       FROM agent_runs WHERE tenant = $1::text AND status IN ('scheduled', 'queued', 'running')
       GROUP BY class, status, project = $2::text`,
      [tenant, project],
    )
  ).rows;
  const count = (cls: string, status: string, onlyMine = false) =>
    rows
      .filter((r) => r.class === cls && r.status === status && (!onlyMine || r.mine))
      .reduce((a, r) => a + r.n, 0);
  const oldestDeferred = rows
    .filter((r) => r.class === 'deferred' && r.status === 'queued' && r.oldest !== null)
    .reduce<number | null>((a, r) => (a === null ? r.oldest : Math.min(a, r.oldest!)), null);
  return { count, oldestDeferred };
}
