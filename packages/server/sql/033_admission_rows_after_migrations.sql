-- The admission functions (016, 019) return whole agent_runs rows. Their RETURN QUERY was
-- planned once per session with the row's columns as they were then: after a later migration
-- added a column to agent_runs (a newer server, in a rolling upgrade), every admission on a
-- connection that had admitted before failed with "structure of query does not match function
-- result type" until the connection closed. The row is now read by a statement planned at each
-- call (EXECUTE), so it has the columns the table has at that moment.
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
  RETURN QUERY EXECUTE 'SELECT * FROM sluice_insert_runs($1)' USING runs;
END $$;

CREATE OR REPLACE FUNCTION sluice_admit_held(t text, highest jsonb, runs jsonb, lock_wait_ms int)
RETURNS SETOF agent_runs
LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', lock_wait_ms || 'ms', true);
  RETURN QUERY EXECUTE 'SELECT * FROM sluice_admit_runs($1, $2, $3)' USING t, highest, runs;
END $$;
