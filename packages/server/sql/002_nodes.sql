-- Server processes that execute runs. A run whose process stops heartbeating ends failed
-- with worker_lost (it is never run again: it may already have had side effects).
CREATE TABLE IF NOT EXISTS server_nodes (
  id            text PRIMARY KEY,
  started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  heartbeat_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
