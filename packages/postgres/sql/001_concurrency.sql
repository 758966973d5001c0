-- Sluice PostgreSQL concurrency limiter: tables for limits, leases and waiting requests.
-- `__SCHEMA__` is replaced by the quoted schema name. Every statement is idempotent, so
-- the file can run at every start (under an advisory lock) or once as a migration.

CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

-- One row per limiter name. Its row lock serialises allocation for that limiter, and it
-- stores the limits every worker must agree on.
CREATE TABLE IF NOT EXISTS __SCHEMA__.concurrency_limiters (
  name        text PRIMARY KEY,
  limits      jsonb NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Fence numbers: strictly increasing across every grant of every limiter.
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.concurrency_fence;
-- Arrival order of waiting requests.
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.concurrency_arrival;

-- A lease is a slot. It counts while expires_at is in the future (database time). An
-- `offered` lease was granted to a waiter of another process and awaits its claim; it has a
-- short expiry, so the slot comes back quickly if that waiter is gone.
CREATE TABLE IF NOT EXISTS __SCHEMA__.concurrency_leases (
  id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  limiter      text NOT NULL REFERENCES __SCHEMA__.concurrency_limiters (name) ON DELETE CASCADE,
  workload     text NOT NULL,
  fence        bigint NOT NULL,
  owner        text NOT NULL,
  offered      boolean NOT NULL DEFAULT false,
  waiter_id    uuid,
  acquired_at  timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS concurrency_leases_by_limiter
  ON __SCHEMA__.concurrency_leases (limiter, expires_at);
CREATE INDEX IF NOT EXISTS concurrency_leases_by_waiter
  ON __SCHEMA__.concurrency_leases (waiter_id) WHERE offered;

-- Requests waiting for a slot. `owner` is the process that waits; it refreshes
-- heartbeat_at on each poll, and an entry whose heartbeat is older than the queue entry TTL
-- belongs to a process that is gone.
CREATE TABLE IF NOT EXISTS __SCHEMA__.concurrency_waiters (
  id            uuid PRIMARY KEY,
  limiter       text NOT NULL REFERENCES __SCHEMA__.concurrency_limiters (name) ON DELETE CASCADE,
  workload      text NOT NULL,
  seq           bigint NOT NULL,
  owner         text NOT NULL,
  enqueued_at   timestamptz NOT NULL,
  deadline      timestamptz,
  heartbeat_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS concurrency_waiters_queue
  ON __SCHEMA__.concurrency_waiters (limiter, workload, seq);
