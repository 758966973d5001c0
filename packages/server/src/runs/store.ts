import type { Database, SqlClient } from '@sluice/postgres/database';
import type { Principal } from '../store/tokens.js';
import { toJsonb } from './json.js';
import type { FailureType, FinalStatus, RunClass, RunStatus } from './lifecycle.js';
import { randomId } from '../store/ids.js';

/**
 * Every SQL statement of the run store. Times are read in the database's clock
 * (`clock_timestamp()`), so several server processes agree on due times and expiry.
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
  /** While paused: the calls waiting for a person (see runs/approvals.ts). */
  required_action: { type: 'approve_tool_calls'; tool_calls: unknown[] } | null;
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

/** Inserts an admitted run (inside the admission transaction). */
export async function insertRun(tx: SqlClient, who: Principal, run: NewRun): Promise<RunRow> {
  return (await insertRuns(tx, [{ who, run }]))[0]!;
}

/** A run as `sluice_insert_runs` takes it (sql/016_admission_fast_path.sql): absent keys are NULL. */
function runDocument(who: Principal, run: NewRun): Record<string, unknown> {
  const scheduled = run.schedule !== undefined;
  return {
    id: run.id,
    tenant: who.tenant,
    project: who.project,
    user_id: who.user,
    agent: run.agent,
    class: run.class,
    mode: run.mode,
    status: scheduled ? 'scheduled' : run.mode === 'inline' ? 'running' : 'queued',
    input: run.input,
    metadata: run.metadata,
    worker: run.worker,
    at_ms: run.schedule && 'atMs' in run.schedule ? run.schedule.atMs : undefined,
    delay_ms: run.schedule && 'delayMs' in run.schedule ? run.schedule.delayMs : undefined,
    callback_url: run.callbackUrl,
    thread_id: run.threadId,
    config: run.config,
    api_request: run.apiRequest,
  };
}

/**
 * The most JSON text one statement carries. A batch of large runs (each within the request
 * limits) would otherwise pass V8's longest string or PostgreSQL's jsonb size limit, and fail
 * every run batched with them; past this size a batch is written by several statements.
 */
export const MAX_STATEMENT_JSON_CHARS = 32 * 2 ** 20;

/**
 * The batch as jsonb arrays of at most MAX_STATEMENT_JSON_CHARS each (one run larger than that
 * goes alone); the runs given an id if they have none.
 */
function runDocuments(runs: { who: Principal; run: NewRun }[]): { ids: string[]; chunks: string[] } {
  const ids = runs.map(({ run }) => run.id ?? newRunId());
  const chunks: string[] = [];
  let current: string[] = [];
  let size = 0;
  runs.forEach(({ who, run }, i) => {
    const json = toJsonb(runDocument(who, { ...run, id: ids[i] }))!;
    if (current.length > 0 && size + json.length > MAX_STATEMENT_JSON_CHARS) {
      chunks.push(`[${current.join(',')}]`);
      current = [];
      size = 0;
    }
    current.push(json);
    size += json.length + 1;
  });
  if (current.length > 0) chunks.push(`[${current.join(',')}]`);
  return { ids, chunks };
}

const inOrder = (ids: string[], rows: RunRow[]) => {
  const byId = new Map(rows.map((row) => [row.id, row]));
  return ids.map((id) => byId.get(id)!);
};

async function insertChunks(tx: SqlClient, chunks: string[]): Promise<RunRow[]> {
  const rows: RunRow[] = [];
  for (const chunk of chunks) {
    const inserted = await tx.query<RunRow>(
      `SELECT ${full} FROM sluice_insert_runs($1::jsonb) AS agent_runs`,
      [chunk],
    );
    rows.push(...inserted.rows);
  }
  return rows;
}

/**
 * Inserts admitted runs (one admission batch: one round trip for all of them, unless they are
 * large). Rows come back in the order given.
 */
export async function insertRuns(tx: SqlClient, runs: { who: Principal; run: NewRun }[]): Promise<RunRow[]> {
  const { ids, chunks } = runDocuments(runs);
  return inOrder(ids, await insertChunks(tx, chunks));
}

/** The most a counter row's counts may be for a batch to fit; null: that count has no cap. */
export interface HighestCounts {
  project: string;
  active: number | null;
  scheduled: number | null;
  deferred: number | null;
}

/**
 * Inserts a batch decided from a plain read, unless a count has risen past what the batch
 * allows: then nothing is written and the result is undefined (the caller decides again under
 * the lock). One statement takes the tenant's lock, checks and inserts; it runs inside a
 * transaction (BEGIN, it, COMMIT) and not on its own: a statement sent alone commits on the
 * server even when the connection drops while it waits for the lock, and its caller, told it
 * failed, would try again and make the run twice. READ COMMITTED is stated by the transaction
 * too: the check must read what committed while the statement waited for the lock.
 */
export async function admitDecided(
  db: Database,
  tenant: string,
  highest: HighestCounts[],
  runs: { who: Principal; run: NewRun }[],
): Promise<RunRow[] | undefined> {
  const { ids, chunks } = runDocuments(runs);
  return db.transaction(async (tx) => {
    const first = await tx.query<RunRow>(
      `SELECT ${full} FROM sluice_admit_runs($1::text, $2::jsonb, $3::jsonb) AS agent_runs`,
      [tenant, JSON.stringify(highest), chunks[0]],
    );
    if (first.rows.length === 0) return undefined;
    return inOrder(ids, [...first.rows, ...(await insertChunks(tx, chunks.slice(1)))]);
  });
}

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

export interface Outcome {
  status: FinalStatus;
  output?: unknown;
  error?: { type: FailureType | string; message: string };
  usage?: unknown;
  /** What a successful run of a thread adds to it. */
  threadMessages?: { role: string; content: unknown }[];
}

/**
 * Ends a run this process is executing. Fenced by the worker: a run another process declared
 * lost (or that was canceled and confirmed) is left as it is, and undefined comes back.
 */
export async function finishRun(
  db: Database,
  id: string,
  worker: string,
  outcome: Outcome,
): Promise<RunRow | undefined> {
  // A successful run of a thread appends its messages in the same statement: the thread never
  // shows a run succeeded without its answer, nor an answer of a run that did not.
  return (
    await db.query<RunRow>(
      `WITH done AS (
         UPDATE agent_runs SET status = $3::text, output = $4::jsonb, error = $5::jsonb, usage = $6::jsonb,
           finished_at = clock_timestamp()
         WHERE id = $1::text AND status = 'running' AND worker = $2::text RETURNING ${full}),
       appended AS (
         INSERT INTO thread_messages (thread_id, role, content, run_id)
         SELECT d.thread_id, m.value ->> 'role', m.value -> 'content', d.id
         FROM done d, jsonb_array_elements($7::jsonb) WITH ORDINALITY AS m(value, n)
         WHERE d.thread_id IS NOT NULL AND d.status = 'succeeded' ORDER BY m.n)
       SELECT * FROM done`,
      [
        id,
        worker,
        outcome.status,
        toJsonb(outcome.output),
        toJsonb(outcome.error),
        toJsonb(outcome.usage),
        toJsonb(outcome.threadMessages ?? []),
      ],
    )
  ).rows[0];
}

/** Cancels a run nothing executes (scheduled, queued, paused); undefined when it is in no such state. */
export async function cancelNotStarted(
  db: Database,
  tenant: string,
  id: string,
): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET status = 'canceled', finished_at = clock_timestamp()
       WHERE id = $1::text AND tenant = $2::text AND status IN ('scheduled', 'queued', 'requires_action')
       RETURNING ${full}`,
      [id, tenant],
    )
  ).rows[0];
}

/**
 * Asks the process executing a running run to stop it, and wakes that process at once
 * (NOTIFY 'cancel:<id>'); it also finds the request on its next look at its own runs.
 * Returns the executing worker, or undefined when the run is not running.
 */
export async function requestCancel(db: Database, tenant: string, id: string): Promise<string | undefined> {
  return (
    await db.query<{ worker: string }>(
      `WITH asked AS (
         UPDATE agent_runs SET cancel_requested_at = coalesce(cancel_requested_at, clock_timestamp())
         WHERE id = $1::text AND tenant = $2::text AND status = 'running' RETURNING id, worker)
       SELECT worker, pg_notify('sluice_runs', 'cancel:' || id) FROM asked`,
      [id, tenant],
    )
  ).rows[0]?.worker;
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
      `SELECT id FROM agent_runs WHERE id = ANY($1::text[]) AND status IN ('succeeded', 'failed', 'canceled')`,
      [ids],
    )
  ).rows.map((r) => r.id);
}

/** Queue figures for the queue endpoint: tenant-wide, and for one project. */
export async function queueCounts(db: Database, tenant: string, project: string) {
  const rows = (
    await db.query<{ class: string; status: string; mine: boolean; n: number; oldest: number | null }>(
      `SELECT class, status, project = $2::text AS mine, count(*)::int AS n,
              (extract(epoch FROM min(created_at)))::float8 AS oldest
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
