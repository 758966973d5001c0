-- Runs still in play, by tenant, class and status: the metrics and the dashboard count them on
-- every read (src/ops/run-counts.ts), and they are few, so this partial index stays small.
CREATE INDEX IF NOT EXISTS agent_runs_live ON agent_runs (tenant, class, status)
  WHERE status IN ('scheduled', 'queued', 'running', 'requires_action');
