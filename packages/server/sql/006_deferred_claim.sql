-- The deferred claim walks the queue in admission order, leaving out tenants at their running
-- cap (counted once per claim, not once per queued row).
CREATE INDEX IF NOT EXISTS agent_runs_queue_deferred_seq ON agent_runs (seq) WHERE status = 'queued' AND class = 'deferred';
CREATE INDEX IF NOT EXISTS agent_runs_running_deferred ON agent_runs (tenant) WHERE status = 'running' AND class = 'deferred';
