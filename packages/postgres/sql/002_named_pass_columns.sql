-- Version 2: the allocation pass returns named columns, one meaning each, instead of reusing
-- `id` for the limits and `seq` for the next expiry. A new function rather than a changed
-- one: PostgreSQL cannot change a function's result columns in place, and workers of the
-- previous release keep calling concurrency_pass (unchanged, on the same tables and the
-- same row lock) until they are all replaced. A later version may drop it.
--
-- Rows, by `kind` (columns not listed are NULL):
--   present      waiter_id                  a heartbeated queue entry that is still there
--   claimed      lease_id, workload, owner, seq (the arrival number), fence, waiter_id,
--                acquired_at, expires_at    an offer to a heartbeated entry, now its lease
--   limits       limits_json                the stored limits
--   active       workload, count            slots in use
--   queued       workload, count            requests waiting
--   next-expiry  next_expiry_ms             when the next lease lapses, from now
--   head         workload, waiter_id, owner, seq   the first waiters of each workload
-- Times are epoch milliseconds (float8), so node-postgres and PGlite return the same numbers.
CREATE OR REPLACE FUNCTION __SCHEMA__.concurrency_pass_v2(
  p_limiter text, p_owner text,
  p_enqueue_ids uuid[], p_enqueue_workloads text[], p_enqueue_timeouts_ms float8[],
  p_release uuid[], p_cancel uuid[], p_heartbeat uuid[],
  p_entry_ttl_ms float8, p_heads int, p_lease_ttl_ms float8)
RETURNS TABLE (kind text, workload text, count int, waiter_id text, owner text, seq float8,
  limits_json text, next_expiry_ms float8, lease_id text, fence float8,
  acquired_at float8, expires_at float8)
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
        NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8 FROM hb;
    -- Offers made to these waiters whose notification went astray: take them now.
    RETURN QUERY
      WITH c AS (UPDATE __SCHEMA__.concurrency_leases
                 SET offered = false, expires_at = v_now + p_lease_ttl_ms * interval '1 millisecond'
                 WHERE waiter_id = ANY(p_heartbeat) AND offered AND expires_at > v_now
                 RETURNING *)
      SELECT 'claimed', c.workload, NULL::int, c.waiter_id::text, c.owner, c.waiter_seq::float8,
        NULL::text, NULL::float8, c.id::text, c.fence::float8,
        (extract(epoch FROM c.acquired_at) * 1000)::float8,
        (extract(epoch FROM c.expires_at) * 1000)::float8 FROM c;
  END IF;

  DELETE FROM __SCHEMA__.concurrency_leases WHERE limiter = p_limiter AND expires_at <= v_now;
  DELETE FROM __SCHEMA__.concurrency_waiters WHERE limiter = p_limiter
    AND (heartbeat_at <= v_now - p_entry_ttl_ms * interval '1 millisecond' OR deadline <= v_now);

  RETURN QUERY SELECT 'limits', NULL::text, NULL::int, NULL::text, NULL::text, NULL::float8,
    v_limits::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8;
  RETURN QUERY SELECT 'active', l.workload, count(*)::int, NULL::text, NULL::text, NULL::float8,
      NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_leases l WHERE l.limiter = p_limiter GROUP BY l.workload;
  RETURN QUERY SELECT 'queued', w.workload, count(*)::int, NULL::text, NULL::text, NULL::float8,
      NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_waiters w WHERE w.limiter = p_limiter GROUP BY w.workload;
  -- When the next lease lapses: a process with waiters looks again then, so the slot of a
  -- crashed holder is handed on at its expiry, not at the next routine poll.
  RETURN QUERY SELECT 'next-expiry', NULL::text, NULL::int, NULL::text, NULL::text, NULL::float8,
      NULL::text, (extract(epoch FROM min(l.expires_at) - v_now) * 1000)::float8,
      NULL::text, NULL::float8, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_leases l WHERE l.limiter = p_limiter HAVING count(*) > 0;
  -- No more than p_heads per workload (no pass can grant more than maxConcurrent slots), each
  -- read from the queue index, so the cost does not grow with the queue (a window function
  -- over the whole queue: 0.84 ms a pass with 200 waiting, against 0.73 ms for this).
  RETURN QUERY SELECT 'head', h.workload, NULL::int, h.id::text, h.owner, h.seq::float8,
      NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8
    FROM jsonb_array_elements(v_limits -> 'workloads') AS wl(def),
      LATERAL (SELECT w.id, w.workload, w.owner, w.seq FROM __SCHEMA__.concurrency_waiters w
               WHERE w.limiter = p_limiter AND w.workload = wl.def ->> 'name'
               ORDER BY w.seq LIMIT p_heads) h;
END
$$;
