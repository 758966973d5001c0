-- The counters' trigger updates the tenant's row and then the project's, each by its key,
-- instead of locking both in a first pass and then updating them together.
--
-- One UPDATE of both rows takes them in whatever order its plan reads them: by a sequential scan
-- of this small table, in physical order, which changes as rows are updated. So 015 and 032 first
-- locked them in key order (SELECT ... ORDER BY project FOR UPDATE) to keep every writer to one
-- order. That pass wrote a lock on each row (a WAL record each) and read them twice: three times
-- a deferred run (admission, claim, end), four of a run's 51 WAL records. Two UPDATEs by key take
-- the rows in the same order, the tenant's first, with neither.
--
-- A row not there yet (a tenant's or a project's first run) is inserted at its turn, or added to
-- when a concurrent first run inserted it first. Before, the missing rows were inserted after both
-- UPDATEs, skipping any row a NOT EXISTS then found: one committed by a concurrent first run after
-- this UPDATE missed it lost this change, leaving the count one low until the next reconciliation.
-- A run whose project is '' is counted once in the tenant's row (before, its tenant's first such
-- run failed: ON CONFLICT met the same row twice).
CREATE OR REPLACE FUNCTION sluice_admission_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  was text;
  now_in text;
  -- 1 when the row is a deferred run running (before, after the change).
  was_running int := 0;
  now_running int := 0;
  t text;
  p text;
  -- What the change adds to each count of the rows it touches.
  d_active int;
  d_scheduled int;
  d_deferred int;
  d_running int;
  l_active int;
  l_scheduled int;
  l_deferred int;
  k text;
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
  d_active := (now_in IS NOT DISTINCT FROM 'active')::int - (was IS NOT DISTINCT FROM 'active')::int;
  d_scheduled := (now_in IS NOT DISTINCT FROM 'scheduled')::int - (was IS NOT DISTINCT FROM 'scheduled')::int;
  d_deferred := (now_in IS NOT DISTINCT FROM 'deferred')::int - (was IS NOT DISTINCT FROM 'deferred')::int;
  d_running := now_running - was_running;
  l_active := (was IS NOT DISTINCT FROM 'active')::int;
  l_scheduled := (was IS NOT DISTINCT FROM 'scheduled')::int;
  l_deferred := (was IS NOT DISTINCT FROM 'deferred')::int;
  -- The tenant's row ('') first, then the project's, each by its key: every writer takes them in
  -- this order (a deferred claim and a thread's claim lock the tenant's row first; the
  -- reconciliation locks a tenant's rows in key order). A row not there yet is inserted at its
  -- turn, or added to if another transaction inserted it first (ON CONFLICT waits for that one
  -- and sees what it committed): a look for it made apart from the UPDATE could miss a row
  -- committed in between and drop this change.
  FOREACH k IN ARRAY CASE WHEN p = '' THEN ARRAY[''] ELSE ARRAY['', p] END LOOP
    UPDATE admission_counters SET
      default_active = default_active + d_active,
      default_scheduled = default_scheduled + d_scheduled,
      deferred_waiting = deferred_waiting + d_deferred,
      deferred_running = deferred_running + d_running,
      active_left = active_left + l_active,
      scheduled_left = scheduled_left + l_scheduled,
      deferred_left = deferred_left + l_deferred
    WHERE tenant = t AND project = k;
    IF NOT FOUND THEN
      INSERT INTO admission_counters AS c (tenant, project, default_active, default_scheduled, deferred_waiting,
                                           deferred_running, active_left, scheduled_left, deferred_left)
      VALUES (t, k, d_active, d_scheduled, d_deferred, d_running, l_active, l_scheduled, l_deferred)
      ON CONFLICT (tenant, project) DO UPDATE SET
        default_active = c.default_active + EXCLUDED.default_active,
        default_scheduled = c.default_scheduled + EXCLUDED.default_scheduled,
        deferred_waiting = c.deferred_waiting + EXCLUDED.deferred_waiting,
        deferred_running = c.deferred_running + EXCLUDED.deferred_running,
        active_left = c.active_left + EXCLUDED.active_left,
        scheduled_left = c.scheduled_left + EXCLUDED.scheduled_left,
        deferred_left = c.deferred_left + EXCLUDED.deferred_left;
    END IF;
  END LOOP;
  RETURN NULL;
END $$;
