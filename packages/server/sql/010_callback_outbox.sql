-- Callback outbox: one row per run that ended with a callback_url. The row is written by a
-- trigger in the transaction that ends the run, so no code path that ends a run (the
-- executor, cancel, expiry, worker_lost, drain, or SQL typed by hand) can skip it, and a
-- crash between "run ended" and "callback queued" cannot happen.
--
-- States: pending -> delivered (2xx) | failed (refused destination, 3xx, 4xx other than
-- 408/429: retrying cannot help) | dead (still failing when the retry time ran out).
CREATE TABLE IF NOT EXISTS callback_deliveries (
  -- The webhook-id: the same on every attempt, so a receiver can drop duplicates.
  id               text PRIMARY KEY,
  -- UNIQUE: at most one delivery per run, even if a run leaves a terminal state and ends again.
  run_id           text NOT NULL UNIQUE REFERENCES agent_runs (id) ON DELETE CASCADE,
  tenant           text NOT NULL,
  -- Copied from the run: the destination that was checked when the run was created.
  url              text NOT NULL,
  state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed', 'dead')),
  -- Attempts started (counted at claim time, so an attempt cut short by a crash counts too).
  attempts         int NOT NULL DEFAULT 0,
  -- When the row may next be claimed. A new row is due at once for any dispatcher clock
  -- ('-infinity'), so first attempts also sort before retries. While an attempt is in flight
  -- this holds the end of its lease: a crashed process's row becomes due again by itself.
  next_attempt_at  timestamptz NOT NULL DEFAULT '-infinity',
  -- The claim in flight; an outcome is recorded only by the claim that still holds the row.
  lease            text,
  last_status      int,
  last_error       text,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  finished_at      timestamptz
);
-- The claim query reads due pending rows in next_attempt_at order; finished rows stay out of it.
CREATE INDEX IF NOT EXISTS callback_deliveries_due ON callback_deliveries (next_attempt_at) WHERE state = 'pending';

-- Queues the delivery of a run that just ended. ON CONFLICT: a run gets one delivery ever.
CREATE OR REPLACE FUNCTION sluice_queue_callback() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO callback_deliveries (id, run_id, tenant, url)
  VALUES ('msg_' || replace(gen_random_uuid()::text, '-', ''), NEW.id, NEW.tenant, NEW.callback_url)
  ON CONFLICT (run_id) DO NOTHING;
  RETURN NULL;
END
$$;

-- Every change from a live status to an ending one, whatever statement made it.
CREATE OR REPLACE TRIGGER agent_runs_queue_callback
  AFTER UPDATE ON agent_runs FOR EACH ROW
  WHEN (NEW.callback_url IS NOT NULL
        AND NEW.status IN ('succeeded', 'failed', 'canceled')
        AND OLD.status NOT IN ('succeeded', 'failed', 'canceled'))
  EXECUTE FUNCTION sluice_queue_callback();

-- A run written already ended (refused or failed at creation) is told about too.
CREATE OR REPLACE TRIGGER agent_runs_queue_callback_on_insert
  AFTER INSERT ON agent_runs FOR EACH ROW
  WHEN (NEW.callback_url IS NOT NULL AND NEW.status IN ('succeeded', 'failed', 'canceled'))
  EXECUTE FUNCTION sluice_queue_callback();

-- Per-tenant secret that signs callbacks. Kept in clear: an HMAC key must be readable to sign.
CREATE TABLE IF NOT EXISTS tenant_secrets (
  tenant      text PRIMARY KEY,
  secret      text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
