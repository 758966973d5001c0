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
-- What the trigger counts is unchanged: only how it reaches the rows.
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
  more int;
  -- The rows to change, in key order: the tenant's (''), then the project's.
  keys text[];
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
  -- The tenant's row ('') first, then the project's, each by its key: every writer takes them in
  -- this order (a deferred claim and a thread's claim lock the tenant's row first; the
  -- reconciliation locks a tenant's rows in key order).
  keys := CASE WHEN p = '' THEN ARRAY[''] ELSE ARRAY['', p] END;
  touched := 0;
  FOREACH k IN ARRAY keys LOOP
    UPDATE admission_counters SET
      default_active = default_active + (now_in IS NOT DISTINCT FROM 'active')::int - (was IS NOT DISTINCT FROM 'active')::int,
      default_scheduled = default_scheduled + (now_in IS NOT DISTINCT FROM 'scheduled')::int - (was IS NOT DISTINCT FROM 'scheduled')::int,
      deferred_waiting = deferred_waiting + (now_in IS NOT DISTINCT FROM 'deferred')::int - (was IS NOT DISTINCT FROM 'deferred')::int,
      deferred_running = deferred_running + now_running - was_running,
      active_left = active_left + (was IS NOT DISTINCT FROM 'active')::int,
      scheduled_left = scheduled_left + (was IS NOT DISTINCT FROM 'scheduled')::int,
      deferred_left = deferred_left + (was IS NOT DISTINCT FROM 'deferred')::int
    WHERE tenant = t AND project = k;
    GET DIAGNOSTICS more = ROW_COUNT;
    touched := touched + more;
  END LOOP;
  IF touched < cardinality(keys) THEN
    INSERT INTO admission_counters AS c (tenant, project, default_active, default_scheduled, deferred_waiting, deferred_running)
    SELECT t, key, (now_in IS NOT DISTINCT FROM 'active')::int, (now_in IS NOT DISTINCT FROM 'scheduled')::int,
           (now_in IS NOT DISTINCT FROM 'deferred')::int, now_running
    FROM unnest(keys) AS key
    WHERE NOT EXISTS (SELECT 1 FROM admission_counters WHERE tenant = t AND project = key)
    ON CONFLICT (tenant, project) DO UPDATE SET
      default_active = c.default_active + EXCLUDED.default_active,
      default_scheduled = c.default_scheduled + EXCLUDED.default_scheduled,
      deferred_waiting = c.deferred_waiting + EXCLUDED.deferred_waiting,
      deferred_running = c.deferred_running + EXCLUDED.deferred_running;
  END IF;
  RETURN NULL;
END $$;
