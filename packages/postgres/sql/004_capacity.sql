-- Version 4: budgets, the provider's pause and the adaptive limit (DESIGN.md part 3), shared
-- through the limiter's row as slots are. `capacity` holds what capacity.ts in
-- sluice/concurrency calls CapacityState: each budget's level and the database time it was
-- read at (epoch ms), the pause's end, the effective limit and its counters. NULL: never
-- changed (budgets full, no pause, the limit at maxConcurrent). Every pass reads it under the
-- row lock, and the pass's decisions (allocate, settling) write it back in the same
-- transaction through concurrency_grant_v4, so all processes see one set of buckets.
--
-- A queue entry and a lease carry the request's token estimate: the grant takes it from the
-- buckets, and the release settles it to the usage.
--
-- New functions beside the old ones (result columns and parameters changed): workers of
-- version 3 keep calling concurrency_pass_v3 and concurrency_grant on the same tables and the
-- same row lock while a rolling upgrade runs. Their entries and leases carry 0 tokens, and
-- they neither read nor write `capacity`: until the last of them is replaced, their grants
-- take nothing from the budgets (slots still hold exactly). Give a limiter `rate` or
-- `adaptive` once every worker runs version 4.
--
-- New rows of concurrency_pass_v4, by `kind` (besides those of version 3):
--   released   lease_id, workload, fence, tokens_in, tokens_out   a lease this pass released
--   capacity   limits_json (the capacity, or NULL), fence (the newest fence so far), now_ms
-- and `head` rows carry tokens_in, tokens_out.

ALTER TABLE __SCHEMA__.concurrency_limiters ADD COLUMN IF NOT EXISTS capacity jsonb;
ALTER TABLE __SCHEMA__.concurrency_waiters ADD COLUMN IF NOT EXISTS tokens_in float8 NOT NULL DEFAULT 0;
ALTER TABLE __SCHEMA__.concurrency_waiters ADD COLUMN IF NOT EXISTS tokens_out float8 NOT NULL DEFAULT 0;
ALTER TABLE __SCHEMA__.concurrency_leases ADD COLUMN IF NOT EXISTS tokens_in float8 NOT NULL DEFAULT 0;
ALTER TABLE __SCHEMA__.concurrency_leases ADD COLUMN IF NOT EXISTS tokens_out float8 NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION __SCHEMA__.concurrency_pass_v4(
  p_limiter text, p_owner text,
  p_enqueue_ids uuid[], p_enqueue_workloads text[], p_enqueue_timeouts_ms float8[], p_enqueue_keys text[],
  p_enqueue_tokens_in float8[], p_enqueue_tokens_out float8[],
  p_release uuid[], p_cancel uuid[], p_heartbeat uuid[],
  p_entry_ttl_ms float8, p_heads int, p_lease_ttl_ms float8)
RETURNS TABLE (kind text, workload text, count int, waiter_id text, owner text, seq float8,
  limits_json text, next_expiry_ms float8, lease_id text, fence float8,
  acquired_at float8, expires_at float8, tag float8, tokens_in float8, tokens_out float8, now_ms float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_limits jsonb;
  v_now timestamptz;
  e record;
  v_virtual float8;
  v_newest float8;
  v_last float8;
  v_capacity jsonb;
BEGIN
  SELECT l.limits, l.capacity INTO v_limits, v_capacity FROM __SCHEMA__.concurrency_limiters l
    WHERE l.name = p_limiter FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  -- Read after the lock: now() is the transaction's start, stale after a lock wait.
  v_now := clock_timestamp();

  -- One row at a time, in arrival order: a request's start tag depends on the requests of its
  -- key queued before it, in this batch too. startTag() in allocate.ts, in SQL:
  -- max(V, newest queued tag + 1, else latest grant tag + 1, else V).
  FOR e IN SELECT * FROM unnest(p_enqueue_ids, p_enqueue_workloads, p_enqueue_timeouts_ms, p_enqueue_keys,
        p_enqueue_tokens_in, p_enqueue_tokens_out)
      WITH ORDINALITY AS x(id, workload, timeout_ms, fair_key, tokens_in, tokens_out, position)
      ORDER BY x.position LOOP
    SELECT coalesce(max(k.last_tag), 0) INTO v_virtual FROM __SCHEMA__.concurrency_fair_keys k
      WHERE k.limiter = p_limiter AND k.workload = e.workload;
    SELECT max(w.tag) INTO v_newest FROM __SCHEMA__.concurrency_waiters w
      WHERE w.limiter = p_limiter AND w.workload = e.workload AND w.fair_key = e.fair_key
        -- Entries that lapsed but are not swept yet (the sweep comes below) do not count: the
        -- in-memory limiter has already dropped them at their deadline.
        AND (w.deadline IS NULL OR w.deadline > v_now)
        AND w.heartbeat_at > v_now - p_entry_ttl_ms * interval '1 millisecond';
    SELECT k.last_tag INTO v_last FROM __SCHEMA__.concurrency_fair_keys k
      WHERE k.limiter = p_limiter AND k.workload = e.workload AND k.fair_key = e.fair_key;
    INSERT INTO __SCHEMA__.concurrency_waiters
      (id, limiter, workload, seq, owner, enqueued_at, deadline, heartbeat_at, fair_key, tag, tokens_in, tokens_out)
    VALUES (e.id, p_limiter, e.workload, nextval('__SCHEMA__.concurrency_arrival'), p_owner, v_now,
      v_now + e.timeout_ms * interval '1 millisecond', v_now, e.fair_key,
      greatest(v_virtual, coalesce(v_newest + 1, v_last + 1, v_virtual)), e.tokens_in, e.tokens_out);
  END LOOP;
  -- Each released lease that was still held, with what its grant was charged: the release
  -- settles it to the usage (pass.ts).
  IF cardinality(p_release) > 0 THEN
    RETURN QUERY
      WITH r AS (DELETE FROM __SCHEMA__.concurrency_leases WHERE id = ANY(p_release) AND limiter = p_limiter
                 RETURNING *)
      SELECT 'released', r.workload, NULL::int, NULL::text, NULL::text, NULL::float8,
        NULL::text, NULL::float8, r.id::text, r.fence::float8, NULL::float8, NULL::float8, NULL::float8,
        r.tokens_in, r.tokens_out, NULL::float8 FROM r;
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
        NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8, NULL::float8,
        NULL::float8, NULL::float8, NULL::float8 FROM hb;
    -- Offers made to these waiters whose notification went astray: take them now.
    RETURN QUERY
      WITH c AS (UPDATE __SCHEMA__.concurrency_leases
                 SET offered = false, expires_at = v_now + p_lease_ttl_ms * interval '1 millisecond'
                 WHERE waiter_id = ANY(p_heartbeat) AND offered AND expires_at > v_now
                 RETURNING *)
      SELECT 'claimed', c.workload, NULL::int, c.waiter_id::text, c.owner, c.waiter_seq::float8,
        NULL::text, NULL::float8, c.id::text, c.fence::float8,
        (extract(epoch FROM c.acquired_at) * 1000)::float8,
        (extract(epoch FROM c.expires_at) * 1000)::float8, NULL::float8, NULL::float8, NULL::float8, NULL::float8 FROM c;
  END IF;

  DELETE FROM __SCHEMA__.concurrency_leases WHERE limiter = p_limiter AND expires_at <= v_now;
  DELETE FROM __SCHEMA__.concurrency_waiters WHERE limiter = p_limiter
    AND (heartbeat_at <= v_now - p_entry_ttl_ms * interval '1 millisecond' OR deadline <= v_now);

  RETURN QUERY SELECT 'limits', NULL::text, NULL::int, NULL::text, NULL::text, NULL::float8,
    v_limits::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8, NULL::float8,
    NULL::float8, NULL::float8, NULL::float8;
  -- Budgets, pause and adaptive limit as stored (NULL: never changed), the database's time
  -- they are read at, and the newest fence handed out so far (the fence sequence's, shared by
  -- every limiter of the schema and never going back: any lease granted later has a higher one).
  RETURN QUERY SELECT 'capacity', NULL::text, NULL::int, NULL::text, NULL::text, NULL::float8,
    v_capacity::text, NULL::float8, NULL::text,
    (SELECT s.last_value::float8 FROM __SCHEMA__.concurrency_fence s), NULL::float8, NULL::float8, NULL::float8,
    NULL::float8, NULL::float8, (extract(epoch FROM v_now) * 1000)::float8;
  RETURN QUERY SELECT 'active', l.workload, count(*)::int, NULL::text, NULL::text, NULL::float8,
      NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8, NULL::float8,
      NULL::float8, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_leases l WHERE l.limiter = p_limiter GROUP BY l.workload;
  RETURN QUERY SELECT 'queued', w.workload, count(*)::int, NULL::text, NULL::text, NULL::float8,
      NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8, NULL::float8,
      NULL::float8, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_waiters w WHERE w.limiter = p_limiter GROUP BY w.workload;
  -- When the next lease lapses: a process with waiters looks again then, so the slot of a
  -- crashed holder is handed on at its expiry, not at the next routine poll.
  RETURN QUERY SELECT 'next-expiry', NULL::text, NULL::int, NULL::text, NULL::text, NULL::float8,
      NULL::text, (extract(epoch FROM min(l.expires_at) - v_now) * 1000)::float8,
      NULL::text, NULL::float8, NULL::float8, NULL::float8, NULL::float8,
      NULL::float8, NULL::float8, NULL::float8
    FROM __SCHEMA__.concurrency_leases l WHERE l.limiter = p_limiter HAVING count(*) > 0;
  -- No more than p_heads per workload (no pass can grant more than maxConcurrent slots), in
  -- serving order (servingOrder() in allocate.ts: start tag, then arrival), each read from the
  -- queue's (limiter, workload, tag, seq) index, so the cost does not grow with the queue.
  RETURN QUERY SELECT 'head', h.workload, NULL::int, h.id::text, h.owner, h.seq::float8,
      NULL::text, NULL::float8, NULL::text, NULL::float8, NULL::float8, NULL::float8, h.tag,
      h.tokens_in, h.tokens_out, NULL::float8
    FROM jsonb_array_elements(v_limits -> 'workloads') AS wl(def),
      LATERAL (SELECT w.id, w.workload, w.owner, w.seq, w.tag, w.tokens_in, w.tokens_out
               FROM __SCHEMA__.concurrency_waiters w
               WHERE w.limiter = p_limiter AND w.workload = wl.def ->> 'name'
               ORDER BY w.tag, w.seq LIMIT p_heads) h;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.concurrency_grant_v4(
  p_limiter text, p_waiters uuid[], p_workloads text[], p_owners text[], p_direct boolean[],
  p_seqs float8[], p_dropped uuid[], p_lease_ttl_ms float8, p_offer_ttl_ms float8, p_channel_prefix text,
  p_tokens_in float8[], p_tokens_out float8[], p_capacity jsonb, p_now_ms float8)
RETURNS TABLE (id text, workload text, fence float8, owner text, offered boolean, waiter_id text,
  acquired_at float8, expires_at float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  -- The pass's time: the budgets were counted at it, so a lease's acquired_at is the moment
  -- its tokens left the buckets (what the per-window checks of the tests add up).
  v_now timestamptz := coalesce(to_timestamp(p_now_ms / 1000.0), clock_timestamp());
  r record;
  v_last_workloads text[];
  v_last_keys text[];
BEGIN
  IF p_capacity IS NOT NULL THEN
    UPDATE __SCHEMA__.concurrency_limiters SET capacity = p_capacity WHERE name = p_limiter;
  END IF;
  -- Each key's latest grant, before its queue rows go: the virtual time and the next tags
  -- are read from here (the grants of one pass are in serving order, so max() is the latest).
  IF cardinality(p_waiters) > 0 THEN
    INSERT INTO __SCHEMA__.concurrency_fair_keys AS k (limiter, workload, fair_key, last_tag)
    SELECT w.limiter, w.workload, w.fair_key, max(w.tag) FROM __SCHEMA__.concurrency_waiters w
      WHERE w.id = ANY(p_waiters) GROUP BY w.limiter, w.workload, w.fair_key
    ON CONFLICT (limiter, workload, fair_key) DO UPDATE SET last_tag = greatest(k.last_tag, excluded.last_tag);
    -- A key whose latest grant is older than the virtual time gets the virtual time as its
    -- next tag, as a key never seen does: forget it, so the table holds the keys in play.
    DELETE FROM __SCHEMA__.concurrency_fair_keys k USING (
        SELECT f.workload, max(f.last_tag) AS v FROM __SCHEMA__.concurrency_fair_keys f
        WHERE f.limiter = p_limiter AND f.workload = ANY(p_workloads) GROUP BY f.workload) vt
      WHERE k.limiter = p_limiter AND k.workload = vt.workload AND k.last_tag < vt.v;
  END IF;
  -- The key of each workload's last grant in this pass (the grants come in serving order).
  SELECT array_agg(l.workload), array_agg(l.fair_key) INTO v_last_workloads, v_last_keys
    FROM (SELECT DISTINCT ON (w.workload) w.workload, w.fair_key
          FROM unnest(p_waiters) WITH ORDINALITY AS g(id, position)
          JOIN __SCHEMA__.concurrency_waiters w ON w.id = g.id
          ORDER BY w.workload, g.position DESC) l;
  DELETE FROM __SCHEMA__.concurrency_waiters WHERE id = ANY(p_waiters) OR id = ANY(p_dropped);
  -- A grant that empties its workload's queue: only the key just served keeps its history
  -- (FairQueue#forgetAllBut in sluice/concurrency). Keys of one request each all get the same
  -- tag, so the virtual time never moves on and the rule above would keep every one of them.
  IF v_last_workloads IS NOT NULL THEN
    DELETE FROM __SCHEMA__.concurrency_fair_keys k
      USING unnest(v_last_workloads, v_last_keys) AS l(workload, fair_key)
      WHERE k.limiter = p_limiter AND k.workload = l.workload AND k.fair_key <> l.fair_key
        AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.concurrency_waiters w
                        WHERE w.limiter = p_limiter AND w.workload = l.workload);
  END IF;
  FOR r IN
    INSERT INTO __SCHEMA__.concurrency_leases
      (limiter, workload, fence, owner, offered, waiter_id, waiter_seq, acquired_at, expires_at, tokens_in, tokens_out)
    SELECT p_limiter, g.workload, nextval('__SCHEMA__.concurrency_fence'), g.owner, NOT g.direct, g.waiter_id,
      g.seq, v_now,
      v_now + (CASE WHEN g.direct THEN p_lease_ttl_ms ELSE p_offer_ttl_ms END) * interval '1 millisecond',
      g.tokens_in, g.tokens_out
    FROM unnest(p_waiters, p_workloads, p_owners, p_direct, p_seqs, p_tokens_in, p_tokens_out)
      AS g(waiter_id, workload, owner, direct, seq, tokens_in, tokens_out)
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
