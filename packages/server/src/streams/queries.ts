import { prepared, type Database, type SqlClient } from '@sluice/postgres/database';
import { toJsonb } from '../runs/json.js';
import { sqlList, finalStatuses } from '../runs/states.js';
import { deleteInBatches, PRUNE_MAX_STATEMENTS } from '../store/prune.js';
import type { StoredEvent } from './codec.js';

/** A run's events `seq`, `seq + 1`, ... as one flush wrote them. */
export interface EventRow {
  run_id: string;
  seq: number;
  events: StoredEvent[];
}

/**
 * Rows as a `$n::jsonb` parameter. A model's text may hold what jsonb refuses (U+0000, an
 * unpaired surrogate, which JSON.stringify writes as \u escapes): only then is it cleaned
 * (runs/json.ts), so a batch of ordinary deltas costs one scan of its text.
 */
export function eventsJson(rows: readonly EventRow[]): string {
  const text = JSON.stringify(rows);
  return /\\u0000|\\ud[89a-f]/i.test(text) ? toJsonb(rows)! : text;
}

/**
 * Writes what a process has gathered since its last flush, for every run it executes, in one
 * statement: a row per run and flush. Each watched run that got rows (a reader marked it:
 * streams/follow.ts) is told on `sluice_runs` ('events:<id>'), so readers on other processes
 * look now; NOTIFY is sent at commit and works through a transaction pooler, where LISTEN may
 * not (readers poll too). A flush of runs nobody reads notifies nothing, so it does not queue
 * behind the commit lock of NOTIFY (sql/035_watched_runs.sql). A row written before (a flush
 * retried after a lost answer) is kept as it was.
 */
export async function insertEvents(db: SqlClient, rows: EventRow[]): Promise<void> {
  await db.query(
    prepared(`WITH written AS (
       INSERT INTO agent_run_events (run_id, seq, events)
       SELECT r.run_id, r.seq, r.events FROM jsonb_to_recordset($1::jsonb) AS r(run_id text, seq int, events jsonb)
       ON CONFLICT DO NOTHING
       RETURNING run_id)
     SELECT pg_notify('sluice_runs', 'events:' || w.run_id) FROM (SELECT DISTINCT run_id FROM written) AS w
     WHERE EXISTS (SELECT 1 FROM run_watches r WHERE r.run_id = w.run_id)`),
    [eventsJson(rows)],
  );
}

/**
 * The rows holding events after `after`, oldest first: the primary key finds the run's rows,
 * and a run has a handful of them.
 */
export async function eventsAfter(db: SqlClient, runId: string, after: number): Promise<EventRow[]> {
  const result = await db.query<EventRow>(
    `SELECT run_id, seq, events FROM agent_run_events
     WHERE run_id = $1::text AND seq + jsonb_array_length(events) - 1 > $2::int ORDER BY seq`,
    [runId, after],
  );
  return result.rows;
}

/** The id and name of the run's newest stored event; undefined when it has none. */
export async function newestEvent(
  db: SqlClient,
  runId: string,
): Promise<{ id: number; event: string } | undefined> {
  const result = await db.query<{ id: number; event: string }>(
    `SELECT seq + jsonb_array_length(events) - 1 AS id, events -> -1 ->> 0 AS event
     FROM agent_run_events WHERE run_id = $1::text ORDER BY seq DESC LIMIT 1`,
    [runId],
  );
  return result.rows[0];
}

/**
 * The id of the event that ended a paused run's stream (`run.requires_action`), whether it is
 * stored yet or not: the executor writes it just after the pause (streams/writer.ts), under the
 * id after every other event of the run. What a resume streams comes after it.
 */
export async function pauseEndId(db: SqlClient, runId: string): Promise<number> {
  const newest = await newestEvent(db, runId);
  if (newest === undefined) return 0;
  return newest.event === 'run.requires_action' ? newest.id : newest.id + 1;
}

/**
 * Deletes the events of runs that ended more than `retentionMs` ago, and those of runs that are
 * gone: the events table holds only recent runs, so the join starts from it. `batch` rows a
 * statement while one finds a full batch (store/prune.ts): a busy server stores more than one
 * batch of rows between two passes.
 */
export async function pruneEvents(
  db: Database,
  retentionMs: number,
  batch: number,
  maxStatements = PRUNE_MAX_STATEMENTS,
): Promise<number> {
  return deleteInBatches(
    async () =>
      (
        await db.query<{ run_id: string }>(
          `DELETE FROM agent_run_events WHERE (run_id, seq) IN (
             SELECT e.run_id, e.seq FROM agent_run_events e LEFT JOIN agent_runs r ON r.id = e.run_id
             WHERE r.id IS NULL
                OR (r.status IN (${sqlList(finalStatuses)})
                    AND r.finished_at < clock_timestamp() - make_interval(secs => $1::float8 / 1000))
             LIMIT $2::int)
           RETURNING run_id`,
          [retentionMs, batch],
        )
      ).rows.length,
    batch,
    maxStatements,
  );
}

/**
 * Whether the run's events are past keeping: it ended more than `retentionMs` ago (by the
 * database's clock, which wrote `finished_at`).
 */
export async function eventsExpired(db: SqlClient, runId: string, retentionMs: number): Promise<boolean> {
  const result = await db.query<{ expired: boolean }>(
    `SELECT (status IN (${sqlList(finalStatuses)})
             AND finished_at < clock_timestamp() - make_interval(secs => $2::float8 / 1000)) AS expired
     FROM agent_runs WHERE id = $1::text`,
    [runId, retentionMs],
  );
  return result.rows[0]?.expired === true;
}

// ── What the statements that end a run store (runs/lifecycle.ts finishRun, pauseRun) ──────

/**
 * A CTE of the statements that end a run: its stream events not written yet (EventRow[], as
 * JSON in `param`), inserted as a flush would; a row written already is kept.
 */
export const storedEvents = (param: string) =>
  `stored_events AS (
         INSERT INTO agent_run_events (run_id, seq, events)
         SELECT r.run_id, r.seq, r.events
         FROM jsonb_to_recordset(${param}::jsonb) AS r(run_id text, seq int, events jsonb)
         ON CONFLICT DO NOTHING)`;

/**
 * A CTE that stores the event ending the stream of the run `done` ended (none when `done` is
 * empty: the end was not this statement's to write), in a row of its own: id `idParam`, name
 * `nameParam`, and as data the run as it ended, as codec.ts `compact` keeps the document
 * (store.ts `toApiRun` without input and output), from `done`'s columns (store.ts `full`).
 * Written in the same statement as the end, it is the run at its end whatever changes after.
 */
export const storedLastEvent = (idParam: string, nameParam: string) =>
  `last_event AS (
         INSERT INTO agent_run_events (run_id, seq, events)
         SELECT d.id, ${idParam}::int, jsonb_build_array(jsonb_build_array(${nameParam}::text,
           jsonb_build_object('id', d.id, 'object', 'agent.run', 'agent', d.agent, 'class', d.class,
             'status', d.status, 'error', d.error, 'metadata', d.metadata, 'usage', d.usage,
             'created_at', floor(d.created_at), 'started_at', floor(d.started_at),
             'finished_at', floor(d.finished_at), 'scheduled_for', floor(d.scheduled_for),
             'thread_id', d.thread_id)
           || CASE WHEN d.required_action IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('required_action', d.required_action) END))
         FROM done d WHERE ${idParam}::int IS NOT NULL
         ON CONFLICT DO NOTHING)`;
