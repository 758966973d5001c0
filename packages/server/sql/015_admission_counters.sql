-- Admission counts kept as rows, so admission reads a few numbers by key instead of counting a
-- tenant's runs. One row per tenant (project '') and one per (tenant, project); a trigger keeps
-- them equal to the true counts in the same transaction as every change of a run's status,
-- whatever statement makes it (insert, finish, cancel, expiry, worker_lost, interruption,
-- promotion, resume, retention).
--
--   default_active     default class, queued or running (the default-class cap)
--   default_scheduled  default class, scheduled (the bound on parked runs)
--   deferred_waiting   deferred class, queued or scheduled (the deferred queued cap)
--   *_left             runs that ever left that set: sampled over time, they give the rate at
--                      which places free up (the Retry-After estimate)
CREATE TABLE IF NOT EXISTS admission_counters (
  tenant            text   NOT NULL,
  project           text   NOT NULL,
  default_active    int    NOT NULL DEFAULT 0,
  default_scheduled int    NOT NULL DEFAULT 0,
  deferred_waiting  int    NOT NULL DEFAULT 0,
  active_left       bigint NOT NULL DEFAULT 0,
  scheduled_left    bigint NOT NULL DEFAULT 0,
  deferred_left     bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, project)
);

-- Which counted set a run in this class and status belongs to, if any.
CREATE OR REPLACE FUNCTION sluice_admission_set(cls text, status text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN cls = 'default' AND status IN ('queued', 'running') THEN 'active'
    WHEN cls = 'default' AND status = 'scheduled' THEN 'scheduled'
    WHEN cls = 'deferred' AND status IN ('queued', 'scheduled') THEN 'deferred'
  END
$$;

CREATE OR REPLACE FUNCTION sluice_admission_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  was text;
  now_in text;
  t text;
  p text;
  touched int;
BEGIN
  IF TG_OP = 'INSERT' THEN
    was := NULL; now_in := sluice_admission_set(NEW.class, NEW.status); t := NEW.tenant; p := NEW.project;
  ELSIF TG_OP = 'DELETE' THEN
    was := sluice_admission_set(OLD.class, OLD.status); now_in := NULL; t := OLD.tenant; p := OLD.project;
  ELSE
    was := sluice_admission_set(OLD.class, OLD.status); now_in := sluice_admission_set(NEW.class, NEW.status);
    t := NEW.tenant; p := NEW.project;
  END IF;
  IF was IS NOT DISTINCT FROM now_in THEN
    RETURN NULL;
  END IF;
  -- Both rows locked first, the tenant's ('') first in key order, so every writer locks them in
  -- the same order. The UPDATE alone would not: on a small table with statistics it is a
  -- sequential scan, locking in physical order, and an update moves a row to the end; an
  -- admission batch and a finishing run then deadlocked (admission-counters.test.ts).
  PERFORM 1 FROM admission_counters WHERE tenant = t AND project IN ('', p) ORDER BY project FOR UPDATE;
  UPDATE admission_counters SET
    default_active = default_active + (now_in IS NOT DISTINCT FROM 'active')::int - (was IS NOT DISTINCT FROM 'active')::int,
    default_scheduled = default_scheduled + (now_in IS NOT DISTINCT FROM 'scheduled')::int - (was IS NOT DISTINCT FROM 'scheduled')::int,
    deferred_waiting = deferred_waiting + (now_in IS NOT DISTINCT FROM 'deferred')::int - (was IS NOT DISTINCT FROM 'deferred')::int,
    active_left = active_left + (was IS NOT DISTINCT FROM 'active')::int,
    scheduled_left = scheduled_left + (was IS NOT DISTINCT FROM 'scheduled')::int,
    deferred_left = deferred_left + (was IS NOT DISTINCT FROM 'deferred')::int
  WHERE tenant = t AND project IN ('', p);
  GET DIAGNOSTICS touched = ROW_COUNT;
  IF touched < 2 THEN
    -- A tenant or project seen for the first time (a run can only enter a set here). The rows
    -- stay from then on, so this happens once per project.
    INSERT INTO admission_counters AS c (tenant, project, default_active, default_scheduled, deferred_waiting)
    SELECT t, k, (now_in IS NOT DISTINCT FROM 'active')::int, (now_in IS NOT DISTINCT FROM 'scheduled')::int,
           (now_in IS NOT DISTINCT FROM 'deferred')::int
    FROM unnest(ARRAY['', p]) AS k
    WHERE NOT EXISTS (SELECT 1 FROM admission_counters WHERE tenant = t AND project = k)
    ON CONFLICT (tenant, project) DO UPDATE SET
      default_active = c.default_active + EXCLUDED.default_active,
      default_scheduled = c.default_scheduled + EXCLUDED.default_scheduled,
      deferred_waiting = c.deferred_waiting + EXCLUDED.deferred_waiting;
  END IF;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS agent_runs_admission_insert ON agent_runs;
CREATE TRIGGER agent_runs_admission_insert AFTER INSERT ON agent_runs
  FOR EACH ROW EXECUTE FUNCTION sluice_admission_count();
DROP TRIGGER IF EXISTS agent_runs_admission_update ON agent_runs;
CREATE TRIGGER agent_runs_admission_update AFTER UPDATE OF status ON agent_runs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION sluice_admission_count();
DROP TRIGGER IF EXISTS agent_runs_admission_delete ON agent_runs;
CREATE TRIGGER agent_runs_admission_delete AFTER DELETE ON agent_runs
  FOR EACH ROW EXECUTE FUNCTION sluice_admission_count();

-- Sets a tenant's counters to the true counts; returns how many rows were wrong. Called by
-- admission under the tenant's admission lock, so no admission or promotion runs meanwhile; a
-- finishing run's own counter update waits for this transaction, and applies its change after
-- it. A drift (a bug, a manual edit, a bulk load with triggers off) lasts until the next call.
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
           count(*) FILTER (WHERE s = 'deferred')::int AS deferred
    FROM (SELECT project, sluice_admission_set(class, status) AS s FROM agent_runs
          WHERE tenant = t AND status IN ('scheduled', 'queued', 'running')) r,
         LATERAL (VALUES (''), (r.project)) AS k(project)
    WHERE r.s IS NOT NULL
    GROUP BY k.project
  ), wanted AS (
    SELECT c.project, coalesce(truth.active, 0) AS active, coalesce(truth.scheduled, 0) AS scheduled,
           coalesce(truth.deferred, 0) AS deferred
    FROM admission_counters c LEFT JOIN truth ON truth.project = c.project
    WHERE c.tenant = t
    UNION ALL
    SELECT truth.project, truth.active, truth.scheduled, truth.deferred FROM truth
    WHERE NOT EXISTS (SELECT 1 FROM admission_counters c WHERE c.tenant = t AND c.project = truth.project)
  ), fixed_rows AS (
    INSERT INTO admission_counters AS c (tenant, project, default_active, default_scheduled, deferred_waiting)
    SELECT t, w.project, w.active, w.scheduled, w.deferred FROM wanted w
    ON CONFLICT (tenant, project) DO UPDATE SET
      default_active = EXCLUDED.default_active,
      default_scheduled = EXCLUDED.default_scheduled,
      deferred_waiting = EXCLUDED.deferred_waiting
    WHERE (c.default_active, c.default_scheduled, c.deferred_waiting)
          IS DISTINCT FROM (EXCLUDED.default_active, EXCLUDED.default_scheduled, EXCLUDED.deferred_waiting)
    RETURNING 1)
  SELECT count(*)::int INTO fixed FROM fixed_rows;
  RETURN fixed;
END $$;

-- The counts of the runs already stored (creating the triggers locked agent_runs against writes
-- until this transaction ends, so nothing is counted twice or missed).
INSERT INTO admission_counters (tenant, project, default_active, default_scheduled, deferred_waiting)
SELECT r.tenant, k.project,
       count(*) FILTER (WHERE r.s = 'active')::int,
       count(*) FILTER (WHERE r.s = 'scheduled')::int,
       count(*) FILTER (WHERE r.s = 'deferred')::int
FROM (SELECT tenant, project, sluice_admission_set(class, status) AS s FROM agent_runs
      WHERE status IN ('scheduled', 'queued', 'running')) r,
     LATERAL (VALUES (''), (r.project)) AS k(project)
WHERE r.s IS NOT NULL
GROUP BY r.tenant, k.project
ON CONFLICT (tenant, project) DO UPDATE SET
  default_active = EXCLUDED.default_active,
  default_scheduled = EXCLUDED.default_scheduled,
  deferred_waiting = EXCLUDED.deferred_waiting;
