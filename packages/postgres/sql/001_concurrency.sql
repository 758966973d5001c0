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
  -- Arrival number of the request the slot went to: grants and queue order can be compared.
  waiter_seq   bigint,
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

-- One allocation pass, first half: take the limiter's row lock, apply the caller's changes,
-- sweep what has lapsed, and return the state the shared allocation rules need. Runs inside
-- the caller's transaction, which then writes the grants with concurrency_grant and commits.
-- A function rather than separate statements: one round trip while the lock is held, and
-- plans cached by PL/pgSQL, without named prepared statements (no session state, so
-- transaction-mode poolers work). The changes come in arrays: a process batches everything
-- it has to say to the limiter into one pass.
--   p_enqueue_*: new queue entries of p_owner, in arrival order;
--   p_release:   leases given back;
--   p_cancel:    queue entries withdrawn (with any slot offered or granted to them);
--   p_heartbeat: queue entries of p_owner still waiting (their pending offers are claimed).
CREATE OR REPLACE FUNCTION __SCHEMA__.concurrency_pass(
  p_limiter text, p_owner text,
  p_enqueue_ids uuid[], p_enqueue_workloads text[], p_enqueue_timeouts_ms float8[],
  p_release uuid[], p_cancel uuid[], p_heartbeat uuid[],
  p_entry_ttl_ms float8, p_heads int, p_lease_ttl_ms float8)
RETURNS TABLE (kind text, workload text, n int, id text, owner text, seq float8,
  fence float8, waiter_id text, acquired_at float8, expires_at float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_limits jsonb;
  v_now timestamptz;
BEGIN
  SELECT l.limits INTO v_limits FROM __SCHEMA__.concurrency_limiters l WHERE l.name = p_limiter FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  -- Read after the lock: now() is the transaction's start, stale after a lock wait.
  v_now := clock_timestamp();

  IF cardinality(p_enqueue_ids) > 0 THEN
    INSERT INTO __SCHEMA__.concurrency_waiters (id, limiter, workload, seq, owner, enqueued_at, deadline, heartbeat_at)
    SELECT e.id, p_limiter, e.workload, nextval('__SCHEMA__.concurrency_arrival'), p_owner, v_now,
      v_now + e.timeout_ms * interval '1 millisecond', v_now
    FROM unnest(p_enqueue_ids, p_enqueue_workloads, p_enqueue_timeouts_ms) WITH ORDINALITY
      AS e(id, workload, timeout_ms, position)
    ORDER BY e.position;
  END IF;
  IF cardinality(p_release) > 0 THEN
    DELETE FROM __SCHEMA__.concurrency_leases WHERE id = ANY(p_release) AND limiter = p_limiter;
  END IF;
  IF cardinality(p_cancel) > 0 THEN
    DELETE FROM __SCHEMA__.concurrency_waiters WHERE id = ANY(p_cancel);
    DELETE FROM __SCHEMA__.concurrency_leases WHERE waiter_id = ANY(p_cancel);
  END IF;
  IF cardinality(p_heartbeat) > 0 THEN
    RETURN QUERY
      WITH hb AS (UPDATE __SCHEMA__.concurrency_waiters SET heartbeat_at = v_now
                  WHERE id = ANY(p_heartbeat) RETURNING id)
      SELECT 'present', NULL::text, NULL::int, hb.id::text, NULL::text, NULL::float8,
        NULL::float8, NULL::text, NULL::float8, NULL::float8 FROM hb;
    -- Offers made to these waiters whose notification went astray: take them now.
    RETURN QUERY
      WITH c AS (UPDATE __SCHEMA__.concurrency_leases
                 SET offered = false, expires_at = v_now + p_lease_ttl_ms * interval '1 millisecond'
                 WHERE waiter_id = ANY(p_heartbeat) AND offered AND expires_at > v_now
                 RETURNING *)
      SELECT 'claimed', c.workload, NULL::int, c.id::text, c.owner, c.waiter_seq::float8, c.fence::float8,
        c.waiter_id::text, (extract(epoch FROM c.acquired_at) * 1000)::float8,
        (extract(epoch FROM c.expires_at) * 1000)::float8 FROM c;
  END IF;

  DELETE FROM __SCHEMA__.concurrency_leases WHERE limiter = p_limiter AND expires_at <= v_now;
  DELETE FROM __SCHEMA__.concurrency_waiters WHERE limiter = p_limiter
    AND (heartbeat_at <= v_now - p_entry_ttl_ms * interval '1 millisecond' OR deadline <= v_now);

  RETURN QUERY SELECT 'limits', NULL::text, NULL::int, v_limits::text, NULL::text, NULL::float8,
    NULL::float8, NULL::text, NULL::float8, NULL::float8;
  RETURN QUERY SELECT 'active', l.workload, count(*)::int, NULL::text, NULL::text, NULL::float8,
      NULL::float8, NULL::text, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_leases l WHERE l.limiter = p_limiter GROUP BY l.workload;
  RETURN QUERY SELECT 'queued', w.workload, count(*)::int, NULL::text, NULL::text, NULL::float8,
      NULL::float8, NULL::text, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_waiters w WHERE w.limiter = p_limiter GROUP BY w.workload;
  -- When the next lease lapses: a process with waiters looks again then, so the slot of a
  -- crashed holder is handed on at its expiry, not at the next routine poll.
  RETURN QUERY SELECT 'next-expiry', NULL::text, NULL::int, NULL::text, NULL::text,
      (extract(epoch FROM min(l.expires_at) - v_now) * 1000)::float8,
      NULL::float8, NULL::text, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_leases l WHERE l.limiter = p_limiter HAVING count(*) > 0;
  -- No more than p_heads per workload (no pass can grant more than maxConcurrent slots), each
  -- read from the queue index, so the cost does not grow with the queue (a window function
  -- over the whole queue: 0.84 ms a pass with 200 waiting, against 0.73 ms for this).
  RETURN QUERY SELECT 'head', h.workload, NULL::int, h.id::text, h.owner, h.seq::float8,
      NULL::float8, NULL::text, NULL::float8, NULL::float8
    FROM jsonb_array_elements(v_limits -> 'workloads') AS wl(def),
      LATERAL (SELECT w.id, w.workload, w.owner, w.seq FROM __SCHEMA__.concurrency_waiters w
               WHERE w.limiter = p_limiter AND w.workload = wl.def ->> 'name'
               ORDER BY w.seq LIMIT p_heads) h;
END
$$;

-- One allocation pass, second half: write the grants the rules chose. A waiter of the
-- calling process gets its lease directly (p_direct, valid for the lease TTL); a waiter of
-- another process gets an offer (valid for the offer TTL) and a NOTIFY on its process's
-- channel, sent at commit. p_dropped: queue entries to remove without a grant.
CREATE OR REPLACE FUNCTION __SCHEMA__.concurrency_grant(
  p_limiter text, p_waiters uuid[], p_workloads text[], p_owners text[], p_direct boolean[],
  p_seqs float8[], p_dropped uuid[], p_lease_ttl_ms float8, p_offer_ttl_ms float8, p_channel_prefix text)
RETURNS TABLE (id text, workload text, fence float8, owner text, offered boolean, waiter_id text,
  acquired_at float8, expires_at float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := clock_timestamp();
  r record;
BEGIN
  DELETE FROM __SCHEMA__.concurrency_waiters WHERE id = ANY(p_waiters) OR id = ANY(p_dropped);
  FOR r IN
    INSERT INTO __SCHEMA__.concurrency_leases
      (limiter, workload, fence, owner, offered, waiter_id, waiter_seq, acquired_at, expires_at)
    SELECT p_limiter, g.workload, nextval('__SCHEMA__.concurrency_fence'), g.owner, NOT g.direct, g.waiter_id,
      g.seq, v_now,
      v_now + (CASE WHEN g.direct THEN p_lease_ttl_ms ELSE p_offer_ttl_ms END) * interval '1 millisecond'
    FROM unnest(p_waiters, p_workloads, p_owners, p_direct, p_seqs) AS g(waiter_id, workload, owner, direct, seq)
    RETURNING *
  LOOP
    IF r.offered THEN
      PERFORM pg_notify(p_channel_prefix || r.owner,
        json_build_object('l', r.limiter, 'w', r.waiter_id, 'id', r.id)::text);
    END IF;
    id := r.id::text;
    workload := r.workload;
    fence := r.fence::float8;
    owner := r.owner;
    offered := r.offered;
    waiter_id := r.waiter_id::text;
    acquired_at := (extract(epoch FROM r.acquired_at) * 1000)::float8;
    expires_at := (extract(epoch FROM r.expires_at) * 1000)::float8;
    RETURN NEXT;
  END LOOP;
END
$$;
