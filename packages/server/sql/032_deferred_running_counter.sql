-- Deferred runs running, per tenant (and per project), kept by the admission counters' trigger
-- beside the other counts: a deferred claim reads its tenant's count by key and locks that row
-- (runs/claims.ts), so a claim without a thread is one statement instead of a transaction of four.
--
-- No run changes status while this migration runs: the lock below is held to its end, so the
-- counts set here and the trigger's changes after it add up.
LOCK TABLE agent_runs IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE admission_counters ADD COLUMN IF NOT EXISTS deferred_running int NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION sluice_admission_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  was text;
  now_in text;
  -- 1 when the row is a deferred run running (before, after the change).
  was_running int := 0;
  now_running int := 0;
  t text;
  p text;
  touched int;
BEGIN
  IF TG_OP = 'INSERT' THEN
    was := NULL; now_in := sluice_admission_set(NEW.class, NEW.status); t := NEW.tenant; p := NEW.project;
    now_running := (NEW.class = 'deferred' AND NEW.status = 'running')::int;
  ELSIF TG_OP = 'DELETE' THEN
    was := sluice_admission_set(OLD.class, OLD.status); now_in := NULL; t := OLD.tenant; p := OLD.project;
    was_running := (OLD.class = 'deferred' AND OLD.status = 'running')::int;
  ELSE
    was := sluice_admission_set(OLD.class, OLD.status); now_in := sluice_admission_set(NEW.class, NEW.status);
    t := NEW.tenant; p := NEW.project;
    was_running := (OLD.class = 'deferred' AND OLD.status = 'running')::int;
    now_running := (NEW.class = 'deferred' AND NEW.status = 'running')::int;
  END IF;
  IF was IS NOT DISTINCT FROM now_in AND was_running = now_running THEN
    RETURN NULL;
  END IF;
  -- Both rows locked first, the tenant's ('') first in key order, so every writer locks them in
  -- the same order (see 015_admission_counters.sql). A deferred claim locks the tenant's row
  -- before its UPDATE fires this: the same order.
  PERFORM 1 FROM admission_counters WHERE tenant = t AND project IN ('', p) ORDER BY project FOR UPDATE;
  UPDATE admission_counters SET
    default_active = default_active + (now_in IS NOT DISTINCT FROM 'active')::int - (was IS NOT DISTINCT FROM 'active')::int,
    default_scheduled = default_scheduled + (now_in IS NOT DISTINCT FROM 'scheduled')::int - (was IS NOT DISTINCT FROM 'scheduled')::int,
    deferred_waiting = deferred_waiting + (now_in IS NOT DISTINCT FROM 'deferred')::int - (was IS NOT DISTINCT FROM 'deferred')::int,
    deferred_running = deferred_running + now_running - was_running,
    active_left = active_left + (was IS NOT DISTINCT FROM 'active')::int,
    scheduled_left = scheduled_left + (was IS NOT DISTINCT FROM 'scheduled')::int,
    deferred_left = deferred_left + (was IS NOT DISTINCT FROM 'deferred')::int
  WHERE tenant = t AND project IN ('', p);
  GET DIAGNOSTICS touched = ROW_COUNT;
  IF touched < 2 THEN
    INSERT INTO admission_counters AS c (tenant, project, default_active, default_scheduled, deferred_waiting, deferred_running)
    SELECT t, k, (now_in IS NOT DISTINCT FROM 'active')::int, (now_in IS NOT DISTINCT FROM 'scheduled')::int,
           (now_in IS NOT DISTINCT FROM 'deferred')::int, now_running
    FROM unnest(ARRAY['', p]) AS k
    WHERE NOT EXISTS (SELECT 1 FROM admission_counters WHERE tenant = t AND project = k)
    ON CONFLICT (tenant, project) DO UPDATE SET
      default_active = c.default_active + EXCLUDED.default_active,
      default_scheduled = c.default_scheduled + EXCLUDED.default_scheduled,
      deferred_waiting = c.deferred_waiting + EXCLUDED.deferred_waiting,
      deferred_running = c.deferred_running + EXCLUDED.deferred_running;
  END IF;
  RETURN NULL;
END $$;

-- The reconciliation sets the running count too.
CREATE OR REPLACE FUNCTION sluice_reconcile_admission_counters(t text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  fixed int;
BEGIN
  PERFORM 1 FROM admission_counters WHERE tenant = t ORDER BY project FOR UPDATE;
  WITH truth AS (
    SELECT k.project,
           count(*) FILTER (WHERE s = 'active')::int AS active,
           count(*) FILTER (WHERE s = 'scheduled')::int AS scheduled,
           count(*) FILTER (WHERE s = 'deferred')::int AS deferred,
           count(*) FILTER (WHERE running)::int AS running
    FROM (SELECT project, sluice_admission_set(class, status) AS s,
                 class = 'deferred' AND status = 'running' AS running
          FROM agent_runs
          WHERE tenant = t AND status IN ('scheduled', 'queued', 'running')) r,
         LATERAL (VALUES (''), (r.project)) AS k(project)
    WHERE r.s IS NOT NULL OR r.running
    GROUP BY k.project
  ), wanted AS (
    SELECT c.project, coalesce(truth.active, 0) AS active, coalesce(truth.scheduled, 0) AS scheduled,
           coalesce(truth.deferred, 0) AS deferred, coalesce(truth.running, 0) AS running
    FROM admission_counters c LEFT JOIN truth ON truth.project = c.project
    WHERE c.tenant = t
    UNION ALL
    SELECT truth.project, truth.active, truth.scheduled, truth.deferred, truth.running FROM truth
    WHERE NOT EXISTS (SELECT 1 FROM admission_counters c WHERE c.tenant = t AND c.project = truth.project)
  ), fixed_rows AS (
    INSERT INTO admission_counters AS c (tenant, project, default_active, default_scheduled, deferred_waiting, deferred_running)
    SELECT t, w.project, w.active, w.scheduled, w.deferred, w.running FROM wanted w
    ON CONFLICT (tenant, project) DO UPDATE SET
      default_active = EXCLUDED.default_active,
      default_scheduled = EXCLUDED.default_scheduled,
      deferred_waiting = EXCLUDED.deferred_waiting,
      deferred_running = EXCLUDED.deferred_running
    WHERE (c.default_active, c.default_scheduled, c.deferred_waiting, c.deferred_running)
          IS DISTINCT FROM (EXCLUDED.default_active, EXCLUDED.default_scheduled, EXCLUDED.deferred_waiting,
                            EXCLUDED.deferred_running)
    RETURNING 1)
  SELECT count(*)::int INTO fixed FROM fixed_rows;
  RETURN fixed;
END $$;

-- The deferred runs running now.
INSERT INTO admission_counters AS c (tenant, project, deferred_running)
SELECT r.tenant, k.project, count(*)::int
FROM (SELECT tenant, project FROM agent_runs WHERE class = 'deferred' AND status = 'running') r,
     LATERAL (VALUES (''), (r.project)) AS k(project)
GROUP BY r.tenant, k.project
ON CONFLICT (tenant, project) DO UPDATE SET deferred_running = EXCLUDED.deferred_running;
