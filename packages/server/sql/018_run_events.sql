-- The events of each run, so a stream can be resumed (Last-Event-ID) or read from the start, on
-- any process. One row holds one flush: the events `seq`, `seq + 1`, ... of one run, as a JSON
-- array of [name, data] pairs. A streamed reply of hundreds of deltas is a handful of rows, and
-- each flush of a process is one INSERT for every run it executes (src/streams/queries.ts).
-- Rows are kept while the run lives and SLUICE_STREAM_RETENTION_MS after it ended; upkeep
-- deletes the rest (a run removed by retention takes no row lookup: its events are orphans).
CREATE TABLE IF NOT EXISTS agent_run_events (
  run_id text NOT NULL,
  seq integer NOT NULL CHECK (seq >= 1),
  events jsonb NOT NULL CHECK (jsonb_typeof(events) = 'array'),
  PRIMARY KEY (run_id, seq)
);
