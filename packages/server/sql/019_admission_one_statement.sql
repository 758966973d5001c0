-- Admission of held runs in one round trip. A held run (streamed or inline, executed on the
-- process that admits it) whose counts the process expects to fit is written by this one
-- statement, sent on its own (no BEGIN, no COMMIT): it sets its lock wait, takes the tenant's
-- admission lock, checks the counts and inserts, as sluice_admit_runs (016) does, and commits
-- as it returns. Nothing is written and no row comes back when a count rose past what the batch
-- allows, or when the session does not run READ COMMITTED (the check must read what committed
-- while the statement waited for the lock); the caller then decides as before.
--
-- Sent alone, the statement commits even when the connection drops while it waits: its caller,
-- told it failed, refuses the request, and the run is left `running` for a process that does
-- not execute it. A held run is never claimed by a queue worker, so it does not run twice: node
-- upkeep ends it as its own process's orphan (runs/lifecycle.ts endOrphanedRuns). Queued runs,
-- which a worker would execute, keep the transaction.
CREATE OR REPLACE FUNCTION sluice_admit_held(t text, highest jsonb, runs jsonb, lock_wait_ms int)
RETURNS SETOF agent_runs
LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', lock_wait_ms || 'ms', true);
  RETURN QUERY SELECT * FROM sluice_admit_runs(t, highest, runs);
END $$;
