import { prepared, type Database, type SqlClient } from '@sluice/postgres/database';
import type { PausedState, PendingToolCall } from 'sluice';
import { tuning } from '../tuning.js';
import { toJsonb } from './json.js';
import { requiredActionOf, type Decision, type RequiredAction } from './required-action.js';
import { cancelableAtOnce, sqlList, type FailureType, type FinalStatus } from './states.js';
import { lastEventOf } from '../streams/names.js';
import { eventsJson, storedEvents, storedLastEvent, type EventRow } from '../streams/queries.js';
import { full, type RunRow } from './store.js';

export * from './states.js';
export * from './birth.js';

/**
 * The run lifecycle: every state of a run and every statement that moves it, in this one file
 * (test/lifecycle/status-writes.test.ts fails on a status write anywhere else). Each statement
 * checks the state it moves from (compare-and-set), so of two processes making a move from one
 * state, one does and the other finds nothing to move.
 *
 *   admission ──insertRuns, admitDecided─────────────▶ scheduled | queued | running
 *             (bornStatus; written by sluice_insert_runs, sql/016, and sluice_admit, sql/034)
 *
 *   scheduled ──promoteDueDeferred, queueScheduled──▶ queued ──startRun, startFirstDeferred──▶ running
 *   running ──finishRun──▶ succeeded | failed (agent_error, timeout, max_duration_exceeded) | canceled
 *   running ──pauseRun──▶ requires_action ──resumeRun──▶ queued  (keeps its place and its thread)
 *   requires_action ──recordDecisions──▶ requires_action  (the next stage: approvals, then questions)
 *   scheduled | queued | requires_action ──cancelNotStarted──▶ canceled
 *   running ──requestCancel──▶ running, cancel asked ──its process: finishRun──▶ canceled
 *   queued (deferred, not resumed) | scheduled ──expireRuns──▶ failed (expired)
 *   running ──failLostRuns──▶ failed (worker_lost)      its process stopped heartbeating
 *   running ──interruptRuns──▶ failed (interrupted)     its process is draining and out of time
 *   running ──endOrphanedRuns──▶ canceled | failed (worker_lost)   its own process lost it
 *
 * Who makes each move:
 *   bornStatus        admission (runs/admission.ts, for every front): a run with a schedule is
 *                     born scheduled, a held (inline) run running on the admitting process,
 *                     any other queued
 *   promoteDueDeferred, queueScheduled
 *                     node upkeep (runs/scheduler.ts promoteDueRuns): deferred runs at once, a
 *                     default-class one only while its tenant and project have room (caps.ts)
 *   startRun, startFirstDeferred
 *                     a queue worker's claim (runs/claims.ts); a deferred run only while its
 *                     tenant has room under the deferred running cap (caps.ts)
 *   finishRun, pauseRun
 *                     the executor on the process running it (runs/run-execution.ts #persist);
 *                     fenced by `worker`, so a run declared lost meanwhile is left alone. A
 *                     pause that finds a cancel asked ends the run canceled instead.
 *   resumeRun, recordDecisions
 *                     POST .../runs/:id/resume (routes/resume.ts); no cap refuses it
 *   cancelNotStarted, requestCancel
 *                     runs/cancel.ts cancelRun (the cancel endpoint, a held client leaving)
 *   expireRuns, failLostRuns
 *                     node upkeep on any process (node/upkeep.ts)
 *   endOrphanedRuns   node upkeep, for the process's own rows it no longer executes
 *   interruptRuns     the drain of a stopping process (app.ts)
 *
 * What the database does on a move (triggers on agent_runs, in the migrations under sql/;
 * test/schema/snapshot.test.ts checks that this list names every trigger there is):
 *
 *   agent_runs_ended (005, 035)               live -> final: takes the run's row out of
 *                                             run_watches, and when it had one (a process waits
 *                                             for it or reads its stream: runs/watching.ts) or
 *                                             was admitted before 035, NOTIFY sluice_runs
 *                                             'end:<id>', which wakes waiting callers
 *   agent_runs_queue_callback (010, 031)      live -> final, with a callback_url: one
 *                                             callback_deliveries row (one per run, ever), and
 *                                             NOTIFY 'callback:<id>' when it wrote one, which
 *                                             wakes the callback dispatchers
 *   agent_runs_queue_callback_on_insert (010) born final, with a callback_url: the same (no
 *                                             path here writes a run born final)
 *   agent_runs_thread_released (011)          live -> final, with a thread: frees the thread if
 *                                             this run holds it; NOTIFY 'thread:<id>'
 *   agent_runs_admission_insert (015)         insert: counts the run in its set
 *   agent_runs_admission_update (015)         any status change: moves the run between sets
 *   agent_runs_admission_delete (015)         delete (retention): takes it out of its set
 *
 * The sets are `sluice_admission_set(class, status)`: `active` (default class, queued or
 * running), `scheduled` (default class, scheduled), `deferred` (deferred class, queued or
 * scheduled); admission_counters keeps their counts per tenant and project (see caps.ts).
 *
 * On each final state those do the same, and the counters depend on the state left:
 *
 *                      succeeded                failed                   canceled
 *   end:<id>           yes, when watched        yes, when watched        yes, when watched
 *   callback row       yes (callback_url)       yes (callback_url)       yes (callback_url)
 *   thread             freed; finishRun has     freed, nothing appended  freed, nothing appended
 *                      appended the messages
 *   counters           leaves `active` (default class from queued or running), `scheduled`
 *                      (default from scheduled) or `deferred` (deferred from queued or
 *                      scheduled); from requires_action, or deferred from running, none
 *
 * Moves between live states change the counters too: promotion takes a default-class run from
 * `scheduled` to `active`, a claim takes a deferred run out of `deferred`, a pause takes one out
 * of `active` and its resume puts it back. `pauseRun` sends 'end:<id>' itself, since waiting
 * callers have their answer though the run is not final.
 *
 * A canceled run that is still executing somewhere keeps counting for its caps until the
 * process executing it confirms, so cancelling through another server frees nothing early.
 *
 * A run in requires_action waits for a person, with no expiry: it holds no worker, no
 * provider slot and no place in the tenant's concurrency cap (which counts queued and running
 * runs), but it keeps its thread, and it is not final (no callback until it ends).
 */

/** Rows one pass of upkeep moves at most (`tuning.upkeepBatch`). */
export const BATCH = tuning.upkeepBatch;

// ── Into the queue, and out of it ────────────────────────────────────────────────────────

/**
 * Moves due scheduled deferred runs to their queue: their place in the deferred queue was
 * counted when they were accepted, so no cap is asked. Returns how many moved.
 */
export async function promoteDueDeferred(db: Database): Promise<number> {
  return (await db.query<{ id: string }>(promoteDueDeferredSql)).rows.length;
}

/** The statement of promoteDueDeferred: returns the ids moved (scheduler.ts runs it in a CTE). */
export const promoteDueDeferredSql = `UPDATE agent_runs SET status = 'queued'
     WHERE id IN (SELECT id FROM agent_runs WHERE status = 'scheduled' AND class = 'deferred'
                    AND scheduled_for <= clock_timestamp()
                  ORDER BY scheduled_for LIMIT ${BATCH} FOR UPDATE SKIP LOCKED)
     RETURNING id`;

/** Moves scheduled runs the caller chose (under the tenant's admission lock, see scheduler.ts). */
export async function queueScheduled(tx: SqlClient, ids: string[]): Promise<void> {
  if (ids.length === 0) return;
  await tx.query(
    `UPDATE agent_runs SET status = 'queued' WHERE id = ANY($1::text[]) AND status = 'scheduled'`,
    [ids],
  );
}

/**
 * Marks a claimed run running for `worker` (inside the claim's transaction, row locked).
 * Given `room`, only while at most `room.highest` deferred runs of `room.tenant` are running
 * (the deferred running cap, caps.ts `highestFitting`), counted by this same statement: the
 * claim holds the tenant's deferred lock, so the count reads every claim that held it before.
 * Undefined when the tenant is full.
 */
export async function startRun(
  tx: SqlClient,
  id: string,
  worker: string,
  room?: { tenant: string; highest: number },
): Promise<RunRow | undefined> {
  return (
    await tx.query<RunRow>(
      room === undefined
        ? `UPDATE agent_runs SET status = 'running', worker = $1::text, started_at = clock_timestamp()
           WHERE id = $2::text RETURNING ${full}`
        : `UPDATE agent_runs SET status = 'running', worker = $1::text, started_at = clock_timestamp()
           WHERE id = $2::text AND (SELECT count(*) FROM agent_runs
                                    WHERE tenant = $3::text AND class = 'deferred' AND status = 'running') <= $4::int
           RETURNING ${full}`,
      room === undefined ? [worker, id] : [worker, id, room.tenant, room.highest],
    )
  ).rows[0];
}

/** startFirstDeferred's statements, by cap, parameter count and candidate. */
const firstDeferredTexts = new Map<string, string>();

/** A tenant's lock for deferred claims (SQL of the tenant's expression), held to the end of the transaction. */
export const deferredLock = (tenant: string) => `hashtext('sluice:deferred:' || ${tenant})`;

/**
 * startRun for a deferred claim in one statement, outside any transaction: `candidate` picks
 * and locks a queued run (its parameters from $1; `highest`, SQL of the highest running count at
 * which one more fits, null uncapped), capped, the tenant's deferred lock is taken (the one a claim's
 * transaction takes), and a run without a thread starts when its tenant's counters row, locked here, has
 * room. Under READ COMMITTED a row lock that waited re-reads the row it got, so a claim of the
 * tenant that started a run and committed meanwhile is counted: the cap holds across workers
 * and processes. The start's own trigger (015, 032) counts the run. That re-read is READ
 * COMMITTED's: a session whose default isolation is stricter picks nothing here. Undefined when
 * there is no candidate; `run` undefined when the caller's transaction must decide (a thread's
 * run, a tenant filled meanwhile or without a counters row, a session not READ COMMITTED).
 *
 * The claim's most frequent statement, and its costliest to plan: its text is built once per
 * candidate and cap, and prepared (claims.ts keeps those few).
 */
export async function startFirstDeferred(
  db: SqlClient,
  candidate: string,
  highest: string | null,
  params: unknown[],
  worker: string,
): Promise<{ run: RunRow | undefined } | undefined> {
  const key = `${highest}\0${params.length}\0${candidate}`;
  let text = firstDeferredTexts.get(key);
  if (text === undefined) {
    const workerParam = `$${params.length + 1}`;
    text = prepared(
      `WITH candidate AS MATERIALIZED (
         SELECT * FROM (${candidate}) c WHERE current_setting('transaction_isolation') = 'read committed'),
       picked AS MATERIALIZED (
         SELECT id, tenant, thread_id${
           highest !== null ? `, pg_advisory_xact_lock(${deferredLock('tenant')}) IS NULL AS locked` : ''
         }
         FROM candidate),
       room AS MATERIALIZED (${
         highest !== null
           ? `SELECT c.tenant FROM admission_counters c JOIN picked p ON c.tenant = p.tenant
              WHERE c.project = '' AND p.thread_id IS NULL AND c.deferred_running <= ${highest}
              FOR UPDATE OF c`
           : `SELECT tenant FROM picked WHERE thread_id IS NULL`
       }),
       started AS (
         UPDATE agent_runs SET status = 'running', worker = ${workerParam}::text, started_at = clock_timestamp()
         WHERE id = (SELECT id FROM picked) AND EXISTS (SELECT 1 FROM room)
         RETURNING ${full})
       SELECT current_setting('transaction_isolation') AS isolation, p.id AS candidate_id, s.*
       FROM (SELECT 1) one LEFT JOIN picked p ON true LEFT JOIN started s ON true`,
    );
    firstDeferredTexts.set(key, text);
  }
  const row = (
    await db.query<RunRow & { isolation: string; candidate_id: string | null }>(text, [...params, worker])
  ).rows[0]!;
  const { isolation, candidate_id, ...run } = row;
  if (isolation !== 'read committed') return { run: undefined };
  if (candidate_id === null) return undefined;
  return { run: run.id === null ? undefined : run };
}

/**
 * Deferred runs still queued, and scheduled runs still not started, `maxWaitMs` after they
 * became due end failed with `expired`. In batches, so one pass never rewrites a whole backlog.
 */
export async function expireRuns(db: Database, maxWaitMs: number): Promise<number> {
  const result = await db.query<{ id: string }>(
    prepared(`UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'expired', 'message', 'the run was not started within AGENT_DEFERRED_MAX_WAIT_MS')
     WHERE id IN (SELECT id FROM agent_runs
                  -- A resumed run (approvals given) is accepted work: it never expires.
                  WHERE ((status = 'queued' AND class = 'deferred' AND approvals IS NULL) OR status = 'scheduled')
                    AND coalesce(scheduled_for, created_at) < clock_timestamp() - $1::float8 * interval '1 millisecond'
                  LIMIT ${BATCH} FOR UPDATE SKIP LOCKED)
     RETURNING id`),
    [maxWaitMs],
  );
  return result.rows.length;
}

// ── The end of a run its process executes ────────────────────────────────────────────────

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
 *
 * `lastEventId`: the id of the event that ends the run's stream, stored by this statement when
 * (and only when) it writes the end, in a row of its own holding the run as it ended
 * (streams/queries.ts storedLastEvent): a reader that sees the run ended has its whole stream,
 * and no flush follows the end.
 */
export async function finishRun(
  db: Database,
  id: string,
  worker: string,
  outcome: Outcome,
  events: readonly EventRow[] = [],
  lastEventId?: number,
): Promise<RunRow | undefined> {
  // A successful run of a thread appends its messages in the same statement: the thread never
  // shows a run succeeded without its answer, nor an answer of a run that did not. The run's
  // stream events not written yet go in it too, stored whether or not the end is still this
  // process's to write; its last event only with the end.
  return (
    await db.query<RunRow>(
      prepared(`WITH done AS (
         UPDATE agent_runs SET status = $3::text, output = $4::jsonb, error = $5::jsonb, usage = $6::jsonb,
           finished_at = clock_timestamp()
         WHERE id = $1::text AND status = 'running' AND worker = $2::text RETURNING ${full}),
       appended AS (
         INSERT INTO thread_messages (thread_id, role, content, run_id)
         SELECT d.thread_id, m.value ->> 'role', m.value -> 'content', d.id
         FROM done d, jsonb_array_elements($7::jsonb) WITH ORDINALITY AS m(value, n)
         WHERE d.thread_id IS NOT NULL AND d.status = 'succeeded' ORDER BY m.n),
       ${storedEvents('$8')},
       ${storedLastEvent('$9', '$10')}
       SELECT * FROM done`),
      [
        id,
        worker,
        outcome.status,
        toJsonb(outcome.output),
        toJsonb(outcome.error),
        toJsonb(outcome.usage),
        toJsonb(outcome.threadMessages ?? []),
        eventsJson(events),
        lastEventId ?? null,
        lastEventOf(outcome.status),
      ],
    )
  ).rows[0];
}

// ── Waiting for a person ─────────────────────────────────────────────────────────────────

/** What a run that paused writes. */
export interface Pause {
  status: 'requires_action';
  pending: PendingToolCall[];
  state: PausedState;
  usage?: unknown;
}

/**
 * Pauses a run this process executes: no worker from now on, the pending calls shown, the
 * paused state kept. Its thread stays held for as long as it waits (a lease without end: no
 * process renews it, and cancel or the run's end frees it). Waiting callers are woken, as a
 * run that needs a person has answered them for now.
 */
export async function pauseRun(
  db: Database,
  id: string,
  worker: string,
  pause: Pause,
  events: readonly EventRow[] = [],
): Promise<RunRow | undefined> {
  const requiredAction = requiredActionOf(pause.pending, []);
  const paused = (
    await db.query<RunRow>(
      // A cancel asked for from another process that this one has not acted on yet wins: the
      // run ends canceled rather than wait for a person who could then approve the call.
      `WITH paused AS (
         UPDATE agent_runs SET
           status = CASE WHEN cancel_requested_at IS NULL THEN 'requires_action' ELSE 'canceled' END,
           finished_at = CASE WHEN cancel_requested_at IS NULL THEN finished_at ELSE clock_timestamp() END,
           worker = NULL,
           required_action = CASE WHEN cancel_requested_at IS NULL THEN $3::jsonb END,
           paused_state = CASE WHEN cancel_requested_at IS NULL THEN $4::jsonb END,
           approvals = NULL, usage = $5::jsonb
         WHERE id = $1::text AND status = 'running' AND worker = $2::text RETURNING ${full}),
       kept AS (
         UPDATE threads SET lock_expires_at = 'infinity'
         WHERE active_run_id = $1::text AND EXISTS (SELECT 1 FROM paused WHERE status = 'requires_action')
         RETURNING id),
       ${storedEvents('$6')}
       SELECT * FROM paused`,
      [id, worker, toJsonb(requiredAction), toJsonb(pause.state), toJsonb(pause.usage), eventsJson(events)],
    )
  ).rows[0];
  // Callers waiting on other processes re-read the run ('end' wakes them; it is not final).
  if (paused)
    await db.query(`SELECT pg_notify('sluice_runs', 'end:' || $1::text)`, [id]).catch(() => undefined);
  return paused;
}

/**
 * Moves a paused run back to the queue with its answers (compare-and-set on `requires_action`
 * and on the pending calls the answers were checked against: undefined when it was not paused
 * any more, e.g. another resume came first, or when it paused again since, on calls a person
 * has not seen; models reuse call ids, so an id match alone proves nothing). It keeps its
 * place in the queue (its admission order) and its thread, and passes no admission check:
 * it is work that was accepted already. The answers are checked by approvals.ts first.
 */
export async function resumeRun(
  db: Database,
  tenant: string,
  id: string,
  approvals: readonly Decision[],
  checked: RunRow['required_action'],
): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET status = 'queued', mode = 'queued', worker = NULL, required_action = NULL,
         approvals = $3::jsonb
       WHERE id = $1::text AND tenant = $2::text AND status = 'requires_action'
         AND required_action = $4::jsonb
       RETURNING ${full}`,
      [id, tenant, toJsonb(approvals), toJsonb(checked)],
    )
  ).rows[0];
}

/**
 * Keeps a paused run waiting, at its next stage, with the decisions given so far (the same
 * compare-and-set on the stage they were checked against as `resumeRun`). The run stays in
 * requires_action: nothing runs until every pending call of the turn is decided.
 */
export async function recordDecisions(
  db: Database,
  tenant: string,
  id: string,
  decided: readonly Decision[],
  checked: RunRow['required_action'],
  next: RequiredAction,
): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET required_action = $4::jsonb, approvals = $3::jsonb
       WHERE id = $1::text AND tenant = $2::text AND status = 'requires_action'
         AND required_action = $5::jsonb
       RETURNING ${full}`,
      [id, tenant, toJsonb(decided), toJsonb(next), toJsonb(checked)],
    )
  ).rows[0];
}

// ── Cancel ───────────────────────────────────────────────────────────────────────────────

/** Cancels a run nothing executes (scheduled, queued, paused); undefined when it is in no such state. */
export async function cancelNotStarted(
  db: Database,
  tenant: string,
  id: string,
): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET status = 'canceled', finished_at = clock_timestamp()
       WHERE id = $1::text AND tenant = $2::text AND status IN (${sqlList(cancelableAtOnce)})
       RETURNING ${full}`,
      [id, tenant],
    )
  ).rows[0];
}

/**
 * Asks the process executing a running run to stop it, and wakes that process at once
 * (NOTIFY 'cancel:<id>'); it also finds the request on its next look at its own runs.
 * Returns the executing worker, or undefined when the run is not running. The status does not
 * change here: the run ends canceled when its process stops it (finishRun, endOrphanedRuns).
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

// ── Runs their process lost ──────────────────────────────────────────────────────────────

/**
 * Ends runs whose process stopped heartbeating `staleMs` ago (or never registered): failed,
 * `worker_lost`. They are never run again: they may already have had side effects.
 */
export async function failLostRuns(db: Database, staleMs: number): Promise<number> {
  const result = await db.query<{ id: string }>(
    prepared(`UPDATE agent_runs r SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'worker_lost', 'message', 'the server running this run stopped before it finished')
     WHERE r.status = 'running' AND NOT EXISTS (
       SELECT 1 FROM server_nodes n WHERE n.id = r.worker
         AND n.heartbeat_at > clock_timestamp() - $1::float8 * interval '1 millisecond')
     RETURNING r.id`),
    [staleMs],
  );
  return result.rows.length;
}

/** Runs of this process that did not finish within the drain time: failed, `interrupted`. */
export async function interruptRuns(db: Database, node: string, ids: string[]): Promise<string[]> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'interrupted', 'message', 'the server stopped before this run finished; start it again')
     WHERE status = 'running' AND worker = $1::text AND id = ANY($2::text[]) RETURNING id`,
    [node, ids],
  );
  return result.rows.map((r) => r.id);
}

/**
 * Ends this process's own `running` rows that it no longer executes: a run it stopped while its
 * heartbeat was failing, or whose end it could not record while the database was away. Nobody
 * else would end them (this process heartbeats again), and they would hold their tenant's cap.
 * A run asked to cancel ends `canceled`, any other `failed` / `worker_lost`. Rows younger than
 * `graceMs` are left alone: an inline run is written a moment before it starts executing.
 */
export async function endOrphanedRuns(
  db: Database,
  node: string,
  executing: string[],
  graceMs: number,
): Promise<number> {
  const result = await db.query<{ id: string }>(
    prepared(`UPDATE agent_runs SET finished_at = clock_timestamp(),
       status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'canceled' ELSE 'failed' END,
       error = CASE WHEN cancel_requested_at IS NOT NULL THEN NULL ELSE jsonb_build_object('type', 'worker_lost',
         'message', 'the server running this run lost it (its database was away) before it finished') END
     WHERE status = 'running' AND worker = $1::text AND NOT (id = ANY($2::text[]))
       AND started_at < clock_timestamp() - $3::float8 * interval '1 millisecond'
     RETURNING id`),
    [node, executing, graceMs],
  );
  return result.rows.length;
}
