-- The schema of @sluice/server after every migration in packages/server/sql, as pg_dump
-- --schema-only prints it. Generated: do not edit (see test/schema/snapshot.test.ts).
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: sluice_admission_count(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_admission_count() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: sluice_admission_set(text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_admission_set(cls text, status text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
  SELECT CASE
    WHEN cls = 'default' AND status IN ('queued', 'running') THEN 'active'
    WHEN cls = 'default' AND status = 'scheduled' THEN 'scheduled'
    WHEN cls = 'deferred' AND status IN ('queued', 'scheduled') THEN 'deferred'
  END
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: agent_runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_runs (
    id text NOT NULL,
    seq bigint NOT NULL,
    tenant text NOT NULL,
    project text NOT NULL,
    user_id text NOT NULL,
    agent text NOT NULL,
    class text DEFAULT 'default'::text NOT NULL,
    mode text NOT NULL,
    status text NOT NULL,
    input jsonb NOT NULL,
    output jsonb,
    error jsonb,
    metadata jsonb,
    usage jsonb,
    worker text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    scheduled_for timestamp with time zone,
    callback_url text,
    cancel_requested_at timestamp with time zone,
    thread_id text,
    config jsonb,
    api_request jsonb,
    required_action jsonb,
    paused_state jsonb,
    approvals jsonb,
    CONSTRAINT agent_runs_mode_check CHECK ((mode = ANY (ARRAY['inline'::text, 'queued'::text]))),
    CONSTRAINT agent_runs_status_check CHECK ((status = ANY (ARRAY['scheduled'::text, 'queued'::text, 'running'::text, 'requires_action'::text, 'succeeded'::text, 'failed'::text, 'canceled'::text])))
);


--
-- Name: sluice_admit(text, jsonb, jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_admit(t text, highest jsonb, runs jsonb, lock_wait_ms integer) RETURNS SETOF public.agent_runs
    LANGUAGE plpgsql
    AS $$
DECLARE
  first_id text := runs -> 0 ->> 'id';
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', lock_wait_ms || 'ms', true);
  PERFORM pg_advisory_xact_lock(hashtext('sluice:tenant:' || t));
  PERFORM pg_advisory_xact_lock(hashtextextended('sluice:admission:' || first_id, 0));
  IF EXISTS (SELECT 1 FROM admission_fences f WHERE f.batch = first_id) THEN
    RETURN;
  END IF;
  IF EXISTS (
    SELECT 1 FROM jsonb_to_recordset(highest) AS h(project text, active int, scheduled int, deferred int)
    JOIN admission_counters c ON c.tenant = t AND c.project = h.project
    WHERE c.default_active > h.active OR c.default_scheduled > h.scheduled OR c.deferred_waiting > h.deferred
  ) THEN
    RETURN;
  END IF;
  RETURN QUERY
  INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, metadata,
    started_at, worker, scheduled_for, callback_url, thread_id, config, api_request)
  SELECT r ->> 'id', r ->> 'tenant', r ->> 'project', r ->> 'user_id', r ->> 'agent', r ->> 'class',
         r ->> 'mode', r ->> 'status', r -> 'input', r -> 'metadata',
         CASE WHEN r ->> 'mode' = 'inline' THEN clock_timestamp() END,
         CASE WHEN r ->> 'mode' = 'inline' THEN r ->> 'worker' END,
         -- A time in the past is due now: it never counts as having waited since then.
         CASE WHEN r ? 'at_ms' THEN greatest(to_timestamp((r ->> 'at_ms')::float8 / 1000), clock_timestamp())
              WHEN r ? 'delay_ms' THEN clock_timestamp() + (r ->> 'delay_ms')::float8 * interval '1 millisecond' END,
         r ->> 'callback_url', r ->> 'thread_id', r -> 'config', r -> 'api_request'
  FROM jsonb_array_elements(runs) WITH ORDINALITY AS e(r, n)
  ORDER BY n
  RETURNING *;
END $$;


--
-- Name: sluice_admit_held(text, jsonb, jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_admit_held(t text, highest jsonb, runs jsonb, lock_wait_ms integer) RETURNS SETOF public.agent_runs
    LANGUAGE plpgsql
    AS $_$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', lock_wait_ms || 'ms', true);
  RETURN QUERY EXECUTE 'SELECT * FROM sluice_admit_runs($1, $2, $3)' USING t, highest, runs;
END $_$;


--
-- Name: sluice_admit_runs(text, jsonb, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_admit_runs(t text, highest jsonb, runs jsonb) RETURNS SETOF public.agent_runs
    LANGUAGE plpgsql
    AS $_$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('sluice:tenant:' || t));
  -- A statement after the lock: in a volatile function it reads what committed while it waited.
  IF EXISTS (
    SELECT 1 FROM jsonb_to_recordset(highest) AS h(project text, active int, scheduled int, deferred int)
    JOIN admission_counters c ON c.tenant = t AND c.project = h.project
    WHERE c.default_active > h.active OR c.default_scheduled > h.scheduled OR c.deferred_waiting > h.deferred
  ) THEN
    RETURN;
  END IF;
  RETURN QUERY EXECUTE 'SELECT * FROM sluice_insert_runs($1)' USING runs;
END $_$;


--
-- Name: sluice_insert_runs(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_insert_runs(runs jsonb) RETURNS SETOF public.agent_runs
    LANGUAGE sql
    AS $$
  INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, metadata,
    started_at, worker, scheduled_for, callback_url, thread_id, config, api_request)
  SELECT r ->> 'id', r ->> 'tenant', r ->> 'project', r ->> 'user_id', r ->> 'agent', r ->> 'class',
         r ->> 'mode', r ->> 'status', r -> 'input', r -> 'metadata',
         CASE WHEN r ->> 'mode' = 'inline' THEN clock_timestamp() END,
         CASE WHEN r ->> 'mode' = 'inline' THEN r ->> 'worker' END,
         -- A time in the past is due now: it never counts as having waited since then.
         CASE WHEN r ? 'at_ms' THEN greatest(to_timestamp((r ->> 'at_ms')::float8 / 1000), clock_timestamp())
              WHEN r ? 'delay_ms' THEN clock_timestamp() + (r ->> 'delay_ms')::float8 * interval '1 millisecond' END,
         r ->> 'callback_url', r ->> 'thread_id', r -> 'config', r -> 'api_request'
  FROM jsonb_array_elements(runs) WITH ORDINALITY AS e(r, n)
  ORDER BY n
  RETURNING *
$$;


--
-- Name: sluice_queue_callback(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_queue_callback() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: sluice_reconcile_admission_counters(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_reconcile_admission_counters(t text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: sluice_run_ended(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_run_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
    BEGIN
      PERFORM pg_advisory_xact_lock_shared(hashtext('sluice:watch'), hashtext(NEW.id) & 255);
      DELETE FROM run_watches WHERE run_id = NEW.id;
      IF FOUND OR NEW.seq <= 0 THEN
        PERFORM pg_notify('sluice_runs', 'end:' || NEW.id);
      END IF;
      RETURN NULL;
    END $$;


--
-- Name: sluice_thread_released(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sluice_thread_released() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  UPDATE threads SET active_run_id = NULL, lock_expires_at = NULL
  WHERE id = NEW.thread_id AND active_run_id = NEW.id;
  PERFORM pg_notify('sluice_runs', 'thread:' || NEW.thread_id);
  RETURN NULL;
END $$;


--
-- Name: admission_counters; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.admission_counters (
    tenant text NOT NULL,
    project text NOT NULL,
    default_active integer DEFAULT 0 NOT NULL,
    default_scheduled integer DEFAULT 0 NOT NULL,
    deferred_waiting integer DEFAULT 0 NOT NULL,
    active_left bigint DEFAULT 0 NOT NULL,
    scheduled_left bigint DEFAULT 0 NOT NULL,
    deferred_left bigint DEFAULT 0 NOT NULL,
    deferred_running integer DEFAULT 0 NOT NULL
);


--
-- Name: admission_fences; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.admission_fences (
    batch text NOT NULL,
    fenced_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: agent_run_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_run_events (
    run_id text NOT NULL,
    seq integer NOT NULL,
    events jsonb NOT NULL,
    CONSTRAINT agent_run_events_events_check CHECK ((jsonb_typeof(events) = 'array'::text)),
    CONSTRAINT agent_run_events_seq_check CHECK ((seq >= 1))
);


--
-- Name: agent_runs_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.agent_runs_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: agent_runs_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.agent_runs_seq_seq OWNED BY public.agent_runs.seq;


--
-- Name: api_tokens; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.api_tokens (
    id text NOT NULL,
    secret_hash text NOT NULL,
    tenant text NOT NULL,
    project text NOT NULL,
    user_id text NOT NULL,
    role text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT api_tokens_role_check CHECK ((role = ANY (ARRAY['admin'::text, 'member'::text, 'read'::text])))
);


--
-- Name: callback_deliveries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.callback_deliveries (
    id text NOT NULL,
    run_id text NOT NULL,
    tenant text NOT NULL,
    url text NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    lease text,
    last_status integer,
    last_error text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT callback_deliveries_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text, 'dead'::text])))
);


--
-- Name: claim_turn_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.claim_turn_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: claim_turns; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.claim_turns (
    class text NOT NULL,
    tenant text NOT NULL,
    turn bigint NOT NULL
);


--
-- Name: files; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.files (
    id text NOT NULL,
    tenant text NOT NULL,
    project text NOT NULL,
    user_id text NOT NULL,
    mime_type text NOT NULL,
    bytes integer NOT NULL,
    content bytea NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT files_bytes_check CHECK ((bytes >= 0))
);
ALTER TABLE ONLY public.files ALTER COLUMN content SET STORAGE EXTERNAL;


--
-- Name: gateway_usage; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gateway_usage (
    id bigint NOT NULL,
    tenant text NOT NULL,
    gateway text NOT NULL,
    status integer NOT NULL,
    input_tokens bigint DEFAULT 0 NOT NULL,
    output_tokens bigint DEFAULT 0 NOT NULL,
    cost double precision DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: gateway_usage_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.gateway_usage ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.gateway_usage_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: run_watches; Type: TABLE; Schema: public; Owner: -
--

CREATE UNLOGGED TABLE public.run_watches (
    run_id text NOT NULL,
    watched_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: server_nodes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.server_nodes (
    id text NOT NULL,
    started_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: tenant_secrets; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.tenant_secrets (
    tenant text NOT NULL,
    secret text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: thread_messages; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.thread_messages (
    thread_id text NOT NULL,
    seq bigint NOT NULL,
    role text NOT NULL,
    content jsonb NOT NULL,
    run_id text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT thread_messages_role_check CHECK ((role = ANY (ARRAY['user'::text, 'assistant'::text, 'system'::text])))
);


--
-- Name: thread_messages_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.thread_messages_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: thread_messages_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.thread_messages_seq_seq OWNED BY public.thread_messages.seq;


--
-- Name: threads; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.threads (
    id text NOT NULL,
    tenant text NOT NULL,
    project text NOT NULL,
    user_id text NOT NULL,
    metadata jsonb,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    active_run_id text,
    lock_expires_at timestamp with time zone
);


--
-- Name: trigger_deliveries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.trigger_deliveries (
    trigger_id text NOT NULL,
    key text NOT NULL,
    run_id text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: trigger_ticks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.trigger_ticks (
    trigger_id text NOT NULL,
    tick timestamp with time zone NOT NULL,
    run_id text,
    refused text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: triggers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.triggers (
    id text NOT NULL,
    tenant text NOT NULL,
    project text NOT NULL,
    user_id text NOT NULL,
    name text NOT NULL,
    agent text NOT NULL,
    class text NOT NULL,
    schedule text,
    input text,
    secret text NOT NULL,
    last_tick_at timestamp with time zone,
    next_tick_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT triggers_class_check CHECK ((class = ANY (ARRAY['default'::text, 'deferred'::text])))
);


--
-- Name: agent_runs seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_runs ALTER COLUMN seq SET DEFAULT nextval('public.agent_runs_seq_seq'::regclass);


--
-- Name: thread_messages seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.thread_messages ALTER COLUMN seq SET DEFAULT nextval('public.thread_messages_seq_seq'::regclass);


--
-- Name: admission_counters admission_counters_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.admission_counters
    ADD CONSTRAINT admission_counters_pkey PRIMARY KEY (tenant, project);


--
-- Name: admission_fences admission_fences_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.admission_fences
    ADD CONSTRAINT admission_fences_pkey PRIMARY KEY (batch);


--
-- Name: agent_run_events agent_run_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_run_events
    ADD CONSTRAINT agent_run_events_pkey PRIMARY KEY (run_id, seq);


--
-- Name: agent_runs agent_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_runs
    ADD CONSTRAINT agent_runs_pkey PRIMARY KEY (id);


--
-- Name: api_tokens api_tokens_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT api_tokens_pkey PRIMARY KEY (id);


--
-- Name: api_tokens api_tokens_secret_hash_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT api_tokens_secret_hash_key UNIQUE (secret_hash);


--
-- Name: callback_deliveries callback_deliveries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.callback_deliveries
    ADD CONSTRAINT callback_deliveries_pkey PRIMARY KEY (id);


--
-- Name: callback_deliveries callback_deliveries_run_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.callback_deliveries
    ADD CONSTRAINT callback_deliveries_run_id_key UNIQUE (run_id);


--
-- Name: claim_turns claim_turns_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.claim_turns
    ADD CONSTRAINT claim_turns_pkey PRIMARY KEY (class, tenant);


--
-- Name: files files_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.files
    ADD CONSTRAINT files_pkey PRIMARY KEY (id);


--
-- Name: gateway_usage gateway_usage_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gateway_usage
    ADD CONSTRAINT gateway_usage_pkey PRIMARY KEY (id);


--
-- Name: run_watches run_watches_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.run_watches
    ADD CONSTRAINT run_watches_pkey PRIMARY KEY (run_id);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: server_nodes server_nodes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.server_nodes
    ADD CONSTRAINT server_nodes_pkey PRIMARY KEY (id);


--
-- Name: tenant_secrets tenant_secrets_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tenant_secrets
    ADD CONSTRAINT tenant_secrets_pkey PRIMARY KEY (tenant);


--
-- Name: thread_messages thread_messages_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.thread_messages
    ADD CONSTRAINT thread_messages_pkey PRIMARY KEY (thread_id, seq);


--
-- Name: threads threads_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.threads
    ADD CONSTRAINT threads_pkey PRIMARY KEY (id);


--
-- Name: trigger_deliveries trigger_deliveries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trigger_deliveries
    ADD CONSTRAINT trigger_deliveries_pkey PRIMARY KEY (trigger_id, key);


--
-- Name: trigger_ticks trigger_ticks_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trigger_ticks
    ADD CONSTRAINT trigger_ticks_pkey PRIMARY KEY (trigger_id, tick);


--
-- Name: triggers triggers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.triggers
    ADD CONSTRAINT triggers_pkey PRIMARY KEY (id);


--
-- Name: agent_runs_active; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_active ON public.agent_runs USING btree (tenant, project, class) WHERE (status = ANY (ARRAY['queued'::text, 'running'::text]));


--
-- Name: agent_runs_by_tenant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_by_tenant ON public.agent_runs USING btree (tenant, seq);


--
-- Name: agent_runs_by_tenant_time; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_by_tenant_time ON public.agent_runs USING btree (tenant, created_at, id);


--
-- Name: agent_runs_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_due ON public.agent_runs USING btree (scheduled_for) WHERE (status = 'scheduled'::text);


--
-- Name: agent_runs_live; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_live ON public.agent_runs USING btree (tenant, class, status) WHERE (status = ANY (ARRAY['scheduled'::text, 'queued'::text, 'running'::text, 'requires_action'::text]));


--
-- Name: agent_runs_queue_default; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_queue_default ON public.agent_runs USING btree (seq) WHERE ((status = 'queued'::text) AND (class = 'default'::text));


--
-- Name: agent_runs_queue_default_tenant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_queue_default_tenant ON public.agent_runs USING btree (tenant, seq) WHERE ((status = 'queued'::text) AND (class = 'default'::text));


--
-- Name: agent_runs_queue_deferred; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_queue_deferred ON public.agent_runs USING btree (tenant, seq) WHERE ((status = 'queued'::text) AND (class = 'deferred'::text));


--
-- Name: agent_runs_queue_deferred_seq; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_queue_deferred_seq ON public.agent_runs USING btree (seq) WHERE ((status = 'queued'::text) AND (class = 'deferred'::text));


--
-- Name: agent_runs_running; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_running ON public.agent_runs USING btree (worker) WHERE (status = 'running'::text);


--
-- Name: agent_runs_running_deferred; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_running_deferred ON public.agent_runs USING btree (tenant) WHERE ((status = 'running'::text) AND (class = 'deferred'::text));


--
-- Name: agent_runs_thread_queue; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX agent_runs_thread_queue ON public.agent_runs USING btree (thread_id, seq) WHERE ((status = 'queued'::text) AND (thread_id IS NOT NULL));


--
-- Name: callback_deliveries_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX callback_deliveries_due ON public.callback_deliveries USING btree (next_attempt_at) WHERE (state = 'pending'::text);


--
-- Name: gateway_usage_tenant_time; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX gateway_usage_tenant_time ON public.gateway_usage USING btree (tenant, created_at);


--
-- Name: threads_by_tenant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX threads_by_tenant ON public.threads USING btree (tenant, created_at, id);


--
-- Name: trigger_deliveries_run; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX trigger_deliveries_run ON public.trigger_deliveries USING btree (run_id);


--
-- Name: trigger_ticks_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX trigger_ticks_created ON public.trigger_ticks USING btree (created_at);


--
-- Name: trigger_ticks_run; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX trigger_ticks_run ON public.trigger_ticks USING btree (run_id);


--
-- Name: triggers_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX triggers_due ON public.triggers USING btree (next_tick_at) WHERE (schedule IS NOT NULL);


--
-- Name: triggers_tenant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX triggers_tenant ON public.triggers USING btree (tenant, created_at, id);


--
-- Name: agent_runs agent_runs_admission_delete; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_admission_delete AFTER DELETE ON public.agent_runs FOR EACH ROW EXECUTE FUNCTION public.sluice_admission_count();


--
-- Name: agent_runs agent_runs_admission_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_admission_insert AFTER INSERT ON public.agent_runs FOR EACH ROW EXECUTE FUNCTION public.sluice_admission_count();


--
-- Name: agent_runs agent_runs_admission_update; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_admission_update AFTER UPDATE OF status ON public.agent_runs FOR EACH ROW WHEN ((old.status IS DISTINCT FROM new.status)) EXECUTE FUNCTION public.sluice_admission_count();


--
-- Name: agent_runs agent_runs_ended; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_ended AFTER UPDATE OF status ON public.agent_runs FOR EACH ROW WHEN (((new.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])) AND (old.status <> ALL (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])))) EXECUTE FUNCTION public.sluice_run_ended();


--
-- Name: agent_runs agent_runs_queue_callback; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_queue_callback AFTER UPDATE ON public.agent_runs FOR EACH ROW WHEN (((new.callback_url IS NOT NULL) AND (new.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])) AND (old.status <> ALL (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])))) EXECUTE FUNCTION public.sluice_queue_callback();


--
-- Name: agent_runs agent_runs_queue_callback_on_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_queue_callback_on_insert AFTER INSERT ON public.agent_runs FOR EACH ROW WHEN (((new.callback_url IS NOT NULL) AND (new.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])))) EXECUTE FUNCTION public.sluice_queue_callback();


--
-- Name: agent_runs agent_runs_thread_released; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER agent_runs_thread_released AFTER UPDATE OF status ON public.agent_runs FOR EACH ROW WHEN (((new.thread_id IS NOT NULL) AND (new.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])) AND (old.status <> ALL (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])))) EXECUTE FUNCTION public.sluice_thread_released();


--
-- Name: callback_deliveries callback_deliveries_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.callback_deliveries
    ADD CONSTRAINT callback_deliveries_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE CASCADE;


--
-- Name: thread_messages thread_messages_thread_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.thread_messages
    ADD CONSTRAINT thread_messages_thread_id_fkey FOREIGN KEY (thread_id) REFERENCES public.threads(id) ON DELETE CASCADE;


--
-- Name: trigger_deliveries trigger_deliveries_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trigger_deliveries
    ADD CONSTRAINT trigger_deliveries_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE CASCADE;


--
-- Name: trigger_deliveries trigger_deliveries_trigger_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trigger_deliveries
    ADD CONSTRAINT trigger_deliveries_trigger_id_fkey FOREIGN KEY (trigger_id) REFERENCES public.triggers(id) ON DELETE CASCADE;


--
-- Name: trigger_ticks trigger_ticks_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trigger_ticks
    ADD CONSTRAINT trigger_ticks_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE SET NULL;


--
-- Name: trigger_ticks trigger_ticks_trigger_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trigger_ticks
    ADD CONSTRAINT trigger_ticks_trigger_id_fkey FOREIGN KEY (trigger_id) REFERENCES public.triggers(id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


