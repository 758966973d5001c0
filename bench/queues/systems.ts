/** The systems bench:queues compares: the script that serves each, and how to count its runs. */
import type pg from 'pg';

export interface System {
  name: string;
  /** Its server process, relative to this folder. */
  script: string;
  /** Runs not finished yet, and runs that failed, in its database. */
  pending(db: pg.Client): Promise<{ open: number; failed: number }>;
}

const counts = async (db: pg.Client, sql: string) => {
  const row = (await db.query<{ open: number; failed: number }>(sql)).rows[0]!;
  return { open: row.open, failed: row.failed };
};

export const systems: System[] = [
  {
    name: 'sluice',
    script: './sluice-server.ts',
    pending: (db) =>
      counts(
        db,
        `SELECT count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'canceled'))::int AS open,
           count(*) FILTER (WHERE status IN ('failed', 'canceled'))::int AS failed FROM agent_runs`,
      ),
  },
  {
    name: 'graphile-worker 0.16.6',
    script: './graphile-server.ts',
    // A job's row is deleted when it succeeds; a failed attempt keeps it, with its error.
    pending: (db) =>
      counts(
        db,
        `SELECT count(*)::int AS open, count(*) FILTER (WHERE last_error IS NOT NULL)::int AS failed
           FROM graphile_worker._private_jobs`,
      ),
  },
  {
    name: 'pg-boss 10.4.2',
    script: './pg-boss-server.ts',
    pending: (db) =>
      counts(
        db,
        `SELECT count(*) FILTER (WHERE state IN ('created', 'retry', 'active'))::int AS open,
           count(*) FILTER (WHERE state = 'failed')::int AS failed FROM pgboss.job`,
      ),
  },
];
