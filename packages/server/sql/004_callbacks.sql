-- Where to POST a run when it ends.
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS callback_url text;
