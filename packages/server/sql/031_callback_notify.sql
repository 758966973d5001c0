-- A delivery queued by the outbox trigger is told to every process ('callback:<run id>', on
-- the runs' channel), so dispatchers look at the outbox when there is something in it, not at
-- every run's end (most runs have no callback_url).
CREATE OR REPLACE FUNCTION sluice_queue_callback() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO callback_deliveries (id, run_id, tenant, url)
  VALUES ('msg_' || replace(gen_random_uuid()::text, '-', ''), NEW.id, NEW.tenant, NEW.callback_url)
  ON CONFLICT (run_id) DO NOTHING;
  IF FOUND THEN
    PERFORM pg_notify('sluice_runs', 'callback:' || NEW.id);
  END IF;
  RETURN NULL;
END
$$;
