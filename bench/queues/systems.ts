/** The systems bench:queues compares: the script that serves each, and how to count its runs. */
import type pg from 'pg';

export interface System {
  name: string;
  /** Its server process, relative to this folder. */
  script: string;
  /**
   * Runs not finished yet, and the runs of `tenant` not finished yet (queued or running: how
   * many it asks to run at once), in its database. Asked every 10 ms while a measure runs, on
   * the PostgreSQL the systems share: it reads open runs only, through an index where the system
   * has one, so that the bench's own polling does not tax a system for the runs it has finished.
   */
  open(db: pg.Client, tenant: string): Promise<Open>;
  /** The same, and the runs that failed: once, when the measure has ended. */
  pending(db: pg.Client, tenant: string): Promise<Pending>;
}

export interface Open {
  open: number;
  openOfTenant: number;
}

export interface Pending extends Open {
  failed: number;
}

const counts = async <T>(db: pg.Client, sql: string, tenant: string): Promise<T> =>
  (await db.query<T & pg.QueryResultRow>(sql, [tenant])).rows[0]!;

// Sluice keeps every run's row; its open ones are those of the partial index agent_runs_live.
const sluiceOpen = `status IN ('scheduled', 'queued', 'running', 'requires_action')`;

export const systems: System[] = [
  {
    name: 'sluice',
    script: './sluice-server.ts',
    open: (db, tenant) =>
      counts(
        db,
        `SELECT count(*)::int AS open, count(*) FILTER (WHERE tenant = $1)::int AS "openOfTenant"
         FROM agent_runs WHERE ${sluiceOpen}`,
        tenant,
      ),
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
    open: (db, tenant) =>
      counts(
        db,
        `SELECT count(*)::int AS open, count(*) FILTER (WHERE payload ->> 'tenant' = $1)::int AS "openOfTenant"
         FROM graphile_worker._private_jobs`,
        tenant,
      ),
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
    // Completed jobs keep their rows too; pg-boss has no index on the state alone.
    open: (db, tenant) =>
      counts(
        db,
        `SELECT count(*)::int AS open, count(*) FILTER (WHERE data ->> 'tenant' = $1)::int AS "openOfTenant"
         FROM pgboss.job WHERE state IN ('created', 'retry', 'active')`,
        tenant,
      ),
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
