-- Tokens can be revoked: a revoked token is refused on its next request, on every process.
ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS revoked_at timestamptz;

-- A cancel asked of a run executing on another process: that process sees it (NOTIFY, or its
-- next look at its own runs) and stops the run. Until then the run still counts for every cap.
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;

-- One queue index per class, so a deferred backlog is never scanned by a default-class claim.
DROP INDEX IF EXISTS agent_runs_queue;
CREATE INDEX IF NOT EXISTS agent_runs_queue_default ON agent_runs (seq) WHERE status = 'queued' AND class = 'default';
CREATE INDEX IF NOT EXISTS agent_runs_queue_deferred ON agent_runs (tenant, seq) WHERE status = 'queued' AND class = 'deferred';
CREATE INDEX IF NOT EXISTS agent_runs_running ON agent_runs (worker) WHERE status = 'running';
-- Quota and spend windows, and the page cursor (created_at, id) scoped to a tenant.
CREATE INDEX IF NOT EXISTS agent_runs_by_tenant_time ON agent_runs (tenant, created_at, id);

-- Every move into a final state tells the processes that wait on that run, whatever SQL made
-- it (finish, cancel, expiry, worker_lost, interruption): one channel, 'end:<id>'.
CREATE OR REPLACE FUNCTION sluice_run_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sluice_runs', 'end:' || NEW.id);
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS agent_runs_ended ON agent_runs;
CREATE TRIGGER agent_runs_ended AFTER UPDATE OF status ON agent_runs
  FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'canceled') AND OLD.status NOT IN ('succeeded', 'failed', 'canceled'))
  EXECUTE FUNCTION sluice_run_ended();
