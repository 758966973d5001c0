-- Files a tenant uploads (POST /files), kept in the database so that every process serves them.
-- A run refers to an uploaded image by its id (an `input_image` part with `file_id`) and reads the
-- bytes when it executes, so a queued run or one that outlives a restart still finds them.
-- Files are not runs: they count toward no run cap.
CREATE TABLE IF NOT EXISTS files (
  id text PRIMARY KEY,
  tenant text NOT NULL,
  project text NOT NULL,
  user_id text NOT NULL,
  mime_type text NOT NULL,
  bytes integer NOT NULL CHECK (bytes >= 0),
  content bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Images and other uploads are compressed already: store them as they are, out of line.
ALTER TABLE files ALTER COLUMN content SET STORAGE EXTERNAL;
