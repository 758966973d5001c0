-- Sluice run server: API tokens and agent runs.

CREATE TABLE IF NOT EXISTS api_tokens (
  id           text PRIMARY KEY,
  secret_hash  text NOT NULL UNIQUE,
  tenant       text NOT NULL,
  project      text NOT NULL,
  user_id      text NOT NULL,
  role         text NOT NULL CHECK (role IN ('admin', 'member', 'read')),
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per run. `seq` orders pages (a cursor is the last seq seen).
CREATE TABLE IF NOT EXISTS agent_runs (
  id           text PRIMARY KEY,
  seq          bigserial,
  tenant       text NOT NULL,
  project      text NOT NULL,
  user_id      text NOT NULL,
  agent        text NOT NULL,
  class        text NOT NULL DEFAULT 'default',
  mode         text NOT NULL CHECK (mode IN ('inline', 'queued')),
  status       text NOT NULL CHECK (status IN ('scheduled', 'queued', 'running', 'requires_action', 'succeeded', 'failed', 'canceled')),
  input        jsonb NOT NULL,
  output       jsonb,
  error        jsonb,
  metadata     jsonb,
  usage        jsonb,
  worker       text,
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  started_at   timestamptz,
  finished_at  timestamptz
);
CREATE INDEX IF NOT EXISTS agent_runs_by_tenant ON agent_runs (tenant, seq);
CREATE INDEX IF NOT EXISTS agent_runs_active ON agent_runs (tenant, project, class) WHERE status IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS agent_runs_queue ON agent_runs (seq) WHERE status = 'queued';
