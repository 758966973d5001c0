-- What a run created through the OpenAI endpoints was asked with (model name, instructions,
-- background, service tier, previous response), so it can be shown again as that API's object.
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS api_request jsonb;
