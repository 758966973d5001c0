-- Scheduled runs: `scheduled_for` is when a run becomes due (NULL: due when created).
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS scheduled_for timestamptz;
CREATE INDEX IF NOT EXISTS agent_runs_due ON agent_runs (scheduled_for) WHERE status = 'scheduled';
