-- Triggers: webhook endpoints and cron schedules that create runs of one agent, in one class,
-- on behalf of the admin who made them (their tenant, project and user).
CREATE TABLE IF NOT EXISTS triggers (
  id            text PRIMARY KEY,
  tenant        text NOT NULL,
  project       text NOT NULL,
  user_id       text NOT NULL,
  name          text NOT NULL,
  agent         text NOT NULL,
  class         text NOT NULL CHECK (class IN ('default', 'deferred')),
  -- A five-field cron expression read in UTC; NULL for a webhook-only trigger.
  schedule      text,
  -- Text put before the event (a webhook body, or the tick) in every run's input.
  input         text,
  -- The HMAC key senders sign with. Kept readable, as tenant_secrets is: verifying a signature
  -- needs the key itself, so whoever can read this table can sign webhooks for these triggers.
  secret        text NOT NULL,
  -- The latest tick a run was made for (or refused at): older ticks are never made again, even
  -- once their trigger_ticks rows are pruned.
  last_tick_at  timestamptz,
  -- When the next tick comes: upkeep passes read only the triggers that are due, not every one.
  next_tick_at  timestamptz,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS triggers_tenant ON triggers (tenant, created_at, id);
CREATE INDEX IF NOT EXISTS triggers_due ON triggers (next_tick_at) WHERE schedule IS NOT NULL;

-- One row per accepted webhook delivery (its webhook-id, or GitHub's delivery id). Written in the
-- transaction that admits the run, so two copies of one delivery, on any server processes, make
-- one run: the second insert fails on the key and its run is rolled back. Removed with the run.
CREATE TABLE IF NOT EXISTS trigger_deliveries (
  trigger_id  text NOT NULL REFERENCES triggers (id) ON DELETE CASCADE,
  key         text NOT NULL,
  run_id      text NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (trigger_id, key)
);
CREATE INDEX IF NOT EXISTS trigger_deliveries_run ON trigger_deliveries (run_id);

-- One row per schedule tick, written with its run in one transaction: the key makes the run of a
-- tick happen once across every server process. A tick refused by a cap is kept without a run.
CREATE TABLE IF NOT EXISTS trigger_ticks (
  trigger_id  text NOT NULL REFERENCES triggers (id) ON DELETE CASCADE,
  tick        timestamptz NOT NULL,
  run_id      text REFERENCES agent_runs (id) ON DELETE SET NULL,
  refused     text,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (trigger_id, tick)
);
CREATE INDEX IF NOT EXISTS trigger_ticks_created ON trigger_ticks (created_at);
CREATE INDEX IF NOT EXISTS trigger_ticks_run ON trigger_ticks (run_id);
