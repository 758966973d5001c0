-- Approvals: a run whose model called a tool that needs a person's approval pauses in
-- requires_action. What it needs to go on lives in the row, so a pause survives any restart:
--   required_action  what the API shows while paused ({ type: 'approve_tool_calls', tool_calls }),
--   paused_state     the runtime's paused state (system prompt, the run's messages, the pending calls),
--   approvals        the decisions a resume gave, read by the worker that continues the run.
-- A paused run has no worker and no lease of its own; its thread stays held until it ends.
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS required_action jsonb;
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS paused_state jsonb;
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS approvals jsonb;
