-- Admission in one statement sent on its own, whose lost answer can be settled.
--
-- Until now a queued batch was written inside BEGIN ... COMMIT: three round trips, the tenant's
-- lock held across the last. Sent alone, the statement commits even when its connection is cut
-- while it waits for that lock, and its caller, told it failed, would try again. A held run took
-- that risk (019) and left a row for upkeep to end.
--
-- sluice_admit writes a batch alone, and its caller can learn what became of it when the answer
-- is lost (runs/admission-settle.ts): each batch is known by its first run's id. The statement
-- takes the tenant's lock, then the batch's own lock, then checks that the batch was not fenced,
-- then the counts, and inserts. A caller whose answer was lost fences the batch (a committed row
-- here), then takes the batch's lock and reads the runs:
--   - the statement had not passed its fence check: it will see the fence and write nothing,
--     and the runs are not there;
--   - it had: it holds the batch's lock until it commits or fails, so the read waits for it and
--     sees what it left.
-- The caller never waits for the tenant's lock (a stuck holder of it would hold the answer too).
--
-- The INSERT is in the body itself, so its plan is kept for the session and depends on
-- agent_runs: a migration that adds a column makes it planned again with the new columns (the
-- reason for 033's EXECUTE; `SELECT * FROM some_function()` would keep the old ones).
-- sluice_admit_runs and sluice_admit_held stay for servers of the version before.

CREATE TABLE IF NOT EXISTS admission_fences (
  batch     text PRIMARY KEY,
  fenced_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- `highest` as for sluice_admit_runs (016). No row comes back, and nothing is written, when a
-- count rose past it, when the batch was fenced, or when the session is not READ COMMITTED (the
-- checks must read what committed while the statement waited for the locks).
CREATE OR REPLACE FUNCTION sluice_admit(t text, highest jsonb, runs jsonb, lock_wait_ms int)
RETURNS SETOF agent_runs
LANGUAGE plpgsql AS $$
DECLARE
  first_id text := runs -> 0 ->> 'id';
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', lock_wait_ms || 'ms', true);
  PERFORM pg_advisory_xact_lock(hashtext('sluice:tenant:' || t));
  PERFORM pg_advisory_xact_lock(hashtextextended('sluice:admission:' || first_id, 0));
  IF EXISTS (SELECT 1 FROM admission_fences f WHERE f.batch = first_id) THEN
    RETURN;
  END IF;
  IF EXISTS (
    SELECT 1 FROM jsonb_to_recordset(highest) AS h(project text, active int, scheduled int, deferred int)
    JOIN admission_counters c ON c.tenant = t AND c.project = h.project
    WHERE c.default_active > h.active OR c.default_scheduled > h.scheduled OR c.deferred_waiting > h.deferred
  ) THEN
    RETURN;
  END IF;
  RETURN QUERY
  INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, metadata,
    started_at, worker, scheduled_for, callback_url, thread_id, config, api_request)
  SELECT r ->> 'id', r ->> 'tenant', r ->> 'project', r ->> 'user_id', r ->> 'agent', r ->> 'class',
         r ->> 'mode', r ->> 'status', r -> 'input', r -> 'metadata',
         CASE WHEN r ->> 'mode' = 'inline' THEN clock_timestamp() END,
         CASE WHEN r ->> 'mode' = 'inline' THEN r ->> 'worker' END,
         -- A time in the past is due now: it never counts as having waited since then.
         CASE WHEN r ? 'at_ms' THEN greatest(to_timestamp((r ->> 'at_ms')::float8 / 1000), clock_timestamp())
              WHEN r ? 'delay_ms' THEN clock_timestamp() + (r ->> 'delay_ms')::float8 * interval '1 millisecond' END,
         r ->> 'callback_url', r ->> 'thread_id', r -> 'config', r -> 'api_request'
  FROM jsonb_array_elements(runs) WITH ORDINALITY AS e(r, n)
  ORDER BY n
  RETURNING *;
END $$;
