-- NOTIFY only for runs that somebody waits on or reads.
--
-- A transaction that calls pg_notify takes one lock for the whole database at its commit and
-- holds it until the commit is flushed to disk, so every transaction that notifies commits
-- one after another, each waiting for the one before it to reach the disk. Every run's end did
-- ('end:<id>' from agent_runs_ended), and every flush of stream events ('events:<id>'): at a
-- few hundred runs a second those commits queued behind that lock (bench:queues, 0 ms model).
-- Most runs have nobody on another process waiting for them.
--
-- `watched` is set by a process that begins to wait for a run or to read its stream
-- (runs/watching.ts), before it reads the row; from then on the end and the events of that
-- run are announced. An end committed before the mark is seen by the mark itself (it returns
-- the status), and one committed after it reads the marked row (an UPDATE reads the newest
-- version of the row it changes), so no waiter misses an end. A run executed by the process
-- its caller waits on (a held or inline run) needs no NOTIFY: the executor wakes its waiters.
--
-- Not indexed: the mark is a HOT update in the usual case. Runs still going when this runs
-- are marked, so that callers of servers of the version before (which do not mark) still
-- hear of their ends.
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS watched boolean NOT NULL DEFAULT false;

UPDATE agent_runs SET watched = true
WHERE status IN ('scheduled', 'queued', 'running', 'requires_action') AND NOT watched;

DROP TRIGGER IF EXISTS agent_runs_ended ON agent_runs;
CREATE TRIGGER agent_runs_ended AFTER UPDATE OF status ON agent_runs
  FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'canceled') AND OLD.status NOT IN ('succeeded', 'failed', 'canceled')
                     AND NEW.watched)
  EXECUTE FUNCTION sluice_run_ended();
