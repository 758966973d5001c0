-- Admission in one statement. A batch decided from a plain read of the counters (see
-- runs/admission.ts) is written by one call, which takes the tenant's admission lock, checks
-- that the counts still leave room for every run of the batch, and inserts the batch (its first
-- part, when it is too large for one statement): BEGIN, this, COMMIT, where BEGIN, lock, read,
-- insert and COMMIT took five round trips. When a count rose past what the batch allows, nothing
-- is written and no row comes back; the caller then decides again under the lock.

-- The runs of a batch, from a JSON array of objects keyed by column (at_ms and delay_ms for the
-- schedule). A key that is absent is NULL; a JSON null stays a JSON null. Rows are inserted, and
-- so numbered (seq), in the order given.
CREATE OR REPLACE FUNCTION sluice_insert_runs(runs jsonb) RETURNS SETOF agent_runs
LANGUAGE sql AS $$
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
  RETURNING *
$$;

-- `highest`: for counter rows of the tenant, the most each count may be for the batch to fit, as
-- [{project, active, scheduled, deferred}] (the cap less the batch's runs in that set; null for
-- a count without a cap). Any count above it: nothing is written.
CREATE OR REPLACE FUNCTION sluice_admit_runs(t text, highest jsonb, runs jsonb) RETURNS SETOF agent_runs
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('sluice:tenant:' || t));
  -- A statement after the lock: in a volatile function it reads what committed while it waited.
  IF EXISTS (
    SELECT 1 FROM jsonb_to_recordset(highest) AS h(project text, active int, scheduled int, deferred int)
    JOIN admission_counters c ON c.tenant = t AND c.project = h.project
    WHERE c.default_active > h.active OR c.default_scheduled > h.scheduled OR c.deferred_waiting > h.deferred
  ) THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT * FROM sluice_insert_runs(runs);
END $$;
