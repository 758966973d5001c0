-- NOTIFY only for runs that somebody waits on or reads.
--
-- A transaction that calls pg_notify takes one lock for the whole database at its commit and
-- holds it until the commit is flushed to disk, so every transaction that notifies commits
-- one after another, each waiting for the one before it to reach the disk. Every run's end did
-- ('end:<id>' from agent_runs_ended), and every flush of stream events ('events:<id>'): at a
-- few hundred runs a second those commits queued behind that lock (bench:queues, 0 ms model).
-- Most runs have nobody on another process waiting for them.
--
-- A process that begins to wait for a run, or to read its stream, writes a row here first
-- (runs/watching.ts), then reads the run's status. The mark and the end of the run take the
-- run's watch lock (an advisory lock: no row of agent_runs is locked, so a claim's SKIP LOCKED
-- never passes over a queued run being marked), the mark alone, the end shared (both under
-- READ COMMITTED, where each statement of the trigger reads what committed before it began):
--   - an end that took it first has committed before the mark goes on, and the status the
--     mark reads next is final;
--   - a mark that took it first has committed before the end looks here, and the end is
--     announced (each statement of the trigger reads what committed before it began).
-- The end takes the run's row out, so the table holds the runs being watched now.
--
-- Runs admitted before this migration are announced as before, whoever waits for them (a
-- server of the version before does not mark): their `seq` is at most the sequence's value
-- now, written into the function below.
-- The watch lock is one of 256 (the run's id hashed): an end of many runs at once takes at most
-- 256 locks, not one per run (PostgreSQL's lock table is a few thousand entries for the whole
-- server). Runs that share one only make a mark wait for an end's commit.
--
-- UNLOGGED: a mark costs no WAL and no flush at its commit. A crash of the database empties the
-- table, and the waiters of that moment hear of their runs' ends from their shared look instead.
CREATE UNLOGGED TABLE IF NOT EXISTS run_watches (
  run_id     text PRIMARY KEY,
  watched_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

DO $$
BEGIN
  EXECUTE format($f$
    CREATE OR REPLACE FUNCTION sluice_run_ended() RETURNS trigger LANGUAGE plpgsql AS $b$
    BEGIN
      PERFORM pg_advisory_xact_lock_shared(hashtext('sluice:watch'), hashtext(NEW.id) & 255);
      DELETE FROM run_watches WHERE run_id = NEW.id;
      IF FOUND OR NEW.seq <= %s THEN
        PERFORM pg_notify('sluice_runs', 'end:' || NEW.id);
      END IF;
      RETURN NULL;
    END $b$
  $f$, (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM agent_runs_seq_seq));
END $$;
