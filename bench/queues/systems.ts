/** The systems bench:queues compares: the script that serves each, and how to count its runs. */
import type pg from 'pg';

export interface System {
  name: string;
  /** Its server process, relative to this folder. */
  script: string;
  /**
   * Runs not finished yet, runs that failed, and the runs of `tenant` not finished yet (queued
   * or running: how many it asks to run at once), in its database.
   */
  pending(db: pg.Client, tenant: string): Promise<Pending>;
}

export interface Pending {
  open: number;
  failed: number;
  openOfTenant: number;
}

const counts = async (db: pg.Client, sql: string, tenant: string): Promise<Pending> =>
  (await db.query<Pending>(sql, [tenant])).rows[0]!;

export const systems: System[] = [
  {
    name: 'sluice',
    script: './sluice-server.ts',
    pending: (db, tenant) =>
      counts(
        db,
        `SELECT count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'canceled'))::int AS open,
           count(*) FILTER (WHERE status IN ('failed', 'canceled'))::int AS failed,
           count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'canceled') AND tenant = $1)::int
             AS "openOfTenant"
         FROM agent_runs`,
        tenant,
      ),
  },
  {
    name: 'graphile-worker 0.16.6',
    script: './graphile-server.ts',
    // A job's row is deleted when it succeeds; a failed attempt keeps it, with its error.
    pending: (db, tenant) =>
      counts(
        db,
        `SELECT count(*)::int AS open, count(*) FILTER (WHERE last_error IS NOT NULL)::int AS failed,
           count(*) FILTER (WHERE payload ->> 'tenant' = $1)::int AS "openOfTenant"
         FROM graphile_worker._private_jobs`,
        tenant,
      ),
  },
  {
    name: 'pg-boss 10.4.2',
    script: './pg-boss-server.ts',
    pending: (db, tenant) =>
      counts(
        db,
        `SELECT count(*) FILTER (WHERE state IN ('created', 'retry', 'active'))::int AS open,
           count(*) FILTER (WHERE state = 'failed')::int AS failed,
           count(*) FILTER (WHERE state IN ('created', 'retry', 'active') AND data ->> 'tenant' = $1)::int
             AS "openOfTenant"
         FROM pgboss.job`,
        tenant,
      ),
  },
];
