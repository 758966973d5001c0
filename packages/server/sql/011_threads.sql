-- Threads: a tenant's conversations. A run with a thread_id sees the thread's messages as its
-- history, and appends its own when it succeeds.
CREATE TABLE IF NOT EXISTS threads (
  id               text PRIMARY KEY,
  tenant           text NOT NULL,
  project          text NOT NULL,
  user_id          text NOT NULL,
  metadata         jsonb,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- One run at a time: the run holding the thread, until lock_expires_at. The holder's process
  -- renews the lease while the run lives; a lease nobody renews (a crashed process) runs out,
  -- and a holder that reached a final state frees the thread at once (trigger below).
  active_run_id    text,
  lock_expires_at  timestamptz
);
CREATE INDEX IF NOT EXISTS threads_by_tenant ON threads (tenant, created_at, id);

CREATE TABLE IF NOT EXISTS thread_messages (
  thread_id   text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
  seq         bigserial,
  role        text NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
  content     jsonb NOT NULL,
  run_id      text,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (thread_id, seq)
);

ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS thread_id text;
-- The run's bounds as admitted (timeouts, parallel tool calls), so a queued run keeps them.
ALTER TABLE agent_runs ADD COLUMN IF NOT EXISTS config jsonb;
-- Queued runs of a thread wait for it in admission order.
CREATE INDEX IF NOT EXISTS agent_runs_thread_queue ON agent_runs (thread_id, seq) WHERE status = 'queued' AND thread_id IS NOT NULL;

-- A run that reaches a final state, by whatever SQL, gives its thread back and tells the
-- processes waiting for the thread ('thread:<id>').
CREATE OR REPLACE FUNCTION sluice_thread_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE threads SET active_run_id = NULL, lock_expires_at = NULL
  WHERE id = NEW.thread_id AND active_run_id = NEW.id;
  PERFORM pg_notify('sluice_runs', 'thread:' || NEW.thread_id);
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS agent_runs_thread_released ON agent_runs;
CREATE TRIGGER agent_runs_thread_released AFTER UPDATE OF status ON agent_runs
  FOR EACH ROW WHEN (NEW.thread_id IS NOT NULL AND NEW.status IN ('succeeded', 'failed', 'canceled')
                     AND OLD.status NOT IN ('succeeded', 'failed', 'canceled'))
  EXECUTE FUNCTION sluice_thread_released();
