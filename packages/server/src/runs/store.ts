import { randomBytes } from 'node:crypto';
import type { Database } from '@sluice/postgres/database';
import { HttpError } from '../errors.js';
import type { Principal } from '../store/tokens.js';

export type RunStatus =
  'scheduled' | 'queued' | 'running' | 'requires_action' | 'succeeded' | 'failed' | 'canceled';

export interface RunRow {
  id: string;
  seq: number;
  tenant: string;
  project: string;
  user_id: string;
  agent: string;
  class: string;
  mode: 'inline' | 'queued';
  status: RunStatus;
  input: unknown;
  output: unknown;
  error: { type: string; message: string } | null;
  metadata: unknown;
  usage: unknown;
  created_at: number;
  started_at: number | null;
  finished_at: number | null;
  scheduled_for: number | null;
  callback_url: string | null;
}

const columns = `id, seq::float8 AS seq, tenant, project, user_id, agent, class, mode, status, input, output, error,
  metadata, usage, (extract(epoch FROM created_at))::float8 AS created_at,
  (extract(epoch FROM started_at))::float8 AS started_at, (extract(epoch FROM finished_at))::float8 AS finished_at,
  (extract(epoch FROM scheduled_for))::float8 AS scheduled_for, callback_url`;

/** A run as the API shows it. */
export function present(run: RunRow) {
  return {
    id: run.id,
    object: 'agent.run',
    agent: run.agent,
    class: run.class,
    status: run.status,
    input: run.input,
    output: run.output,
    error: run.error,
    metadata: run.metadata,
    usage: run.usage,
    created_at: Math.floor(run.created_at),
    started_at: run.started_at === null ? null : Math.floor(run.started_at),
    finished_at: run.finished_at === null ? null : Math.floor(run.finished_at),
    scheduled_for: run.scheduled_for === null ? null : Math.floor(run.scheduled_for),
  };
}

export interface Caps {
  perTenant: number;
  perProject: number;
  /** Deferred runs queued or scheduled per tenant. */
  deferredQueued: number;
  /** Runs admitted per sliding window. */
  runQuota?: { limit: number; windowMs: number };
  /** Usage cost (USD) per sliding window. */
  spend?: { limitUsd: number; windowMs: number };
}

/**
 * Admits a default-class run or refuses it with 429 before anything is written. The count
 * and the insert happen under a per-tenant advisory lock, so concurrent requests (on any
 * server process sharing the database) cannot both take the last place.
 */
export async function admitRun(
  db: Database,
  who: Principal,
  run: {
    agent: string;
    class: 'default' | 'deferred';
    mode: 'inline' | 'queued';
    input: unknown;
    metadata: unknown;
    worker: string;
    /** Epoch ms when the run becomes due; undefined: now. */
    scheduledFor?: number;
    callbackUrl?: string;
  },
  caps: Caps,
): Promise<RunRow> {
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:tenant:${who.tenant}`]);
    const over = (scope: 'tenant' | 'project', limit: number, active: number, cls: string, what: string) =>
      new HttpError(
        429,
        'agent_run_concurrency_limit',
        `The ${scope} already has ${active} ${what}; the limit is ${limit}`,
        {
          limit: cls === 'default' ? 'max_active_runs' : 'max_queued_runs',
          limit_value: limit,
          scope,
          class: cls,
          active,
        },
        { 'retry-after': '30' },
      );
    // Quota and spend first: they apply to every class. A refused call costs no quota unit,
    // since only admitted runs are rows.
    if (caps.runQuota) {
      const used = (
        await tx.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs
           WHERE tenant = $1 AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
          [who.tenant, caps.runQuota.windowMs],
        )
      ).rows[0]!.n;
      if (used >= caps.runQuota.limit) {
        throw new HttpError(
          429,
          'agent_quota_exceeded',
          `The tenant's agent-run quota is used up: ${used} of ${caps.runQuota.limit} runs in the period`,
          { limit: 'agent_runs', limit_value: caps.runQuota.limit, scope: 'tenant', class: run.class, used },
          { 'retry-after': '60' },
        );
      }
    }
    if (caps.spend) {
      const spent = (
        await tx.query<{ usd: number }>(
          `SELECT coalesce(sum((usage ->> 'cost')::float8), 0)::float8 AS usd FROM agent_runs
           WHERE tenant = $1 AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
          [who.tenant, caps.spend.windowMs],
        )
      ).rows[0]!.usd;
      if (spent >= caps.spend.limitUsd) {
        // Not a retry case: no Retry-After.
        throw new HttpError(
          429,
          'spend_limit_exceeded',
          `The tenant's spend limit is used up: $${spent.toFixed(4)} of $${caps.spend.limitUsd} in the period`,
          {
            limit: 'spend_usd',
            limit_value: caps.spend.limitUsd,
            scope: 'tenant',
            class: run.class,
            spent_usd: spent,
          },
        );
      }
    }
    if (run.class === 'deferred') {
      const queued = (
        await tx.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs
           WHERE tenant = $1 AND class = 'deferred' AND status IN ('queued', 'scheduled')`,
          [who.tenant],
        )
      ).rows[0]!.n;
      if (caps.deferredQueued > 0 && queued >= caps.deferredQueued) {
        throw over('tenant', caps.deferredQueued, queued, 'deferred', 'queued or scheduled deferred runs');
      }
    } else if (run.scheduledFor === undefined) {
      // A scheduled default-class run counts for no cap until it is due (then promotion checks).
      const counts = (
        await tx.query<{ tenant: number; project: number }>(
          `SELECT count(*)::int AS tenant, count(*) FILTER (WHERE project = $2)::int AS project
           FROM agent_runs WHERE tenant = $1 AND class = 'default' AND status IN ('queued', 'running')`,
          [who.tenant, who.project],
        )
      ).rows[0]!;
      const what = 'active default-class runs';
      if (caps.perTenant > 0 && counts.tenant >= caps.perTenant)
        throw over('tenant', caps.perTenant, counts.tenant, 'default', what);
      if (caps.perProject > 0 && counts.project >= caps.perProject) {
        throw over('project', caps.perProject, counts.project, 'default', what);
      }
    }
    const id = `run_${randomBytes(12).toString('hex')}`;
    const inserted = await tx.query<RunRow>(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, metadata, started_at, worker,
         scheduled_for, callback_url)
       VALUES ($1, $2, $3, $4, $5, $11, $6, $7, $8::jsonb, $9::jsonb,
         CASE WHEN $6 = 'inline' THEN clock_timestamp() END, CASE WHEN $6 = 'inline' THEN $10 END,
         to_timestamp($12::float8 / 1000), $13)
       RETURNING ${columns}`,
      [
        id,
        who.tenant,
        who.project,
        who.user,
        run.agent,
        run.mode,
        run.scheduledFor !== undefined ? 'scheduled' : run.mode === 'inline' ? 'running' : 'queued',
        JSON.stringify(run.input),
        run.metadata === undefined ? null : JSON.stringify(run.metadata),
        run.worker,
        run.class,
        run.scheduledFor ?? null,
        run.callbackUrl ?? null,
      ],
    );
    return inserted.rows[0]!;
  });
}

export async function getRun(db: Database, tenant: string, id: string): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(`SELECT ${columns} FROM agent_runs WHERE id = $1 AND tenant = $2`, [id, tenant])
  ).rows[0];
}

export async function listRuns(
  db: Database,
  tenant: string,
  filter: { statuses?: string[]; class?: string; limit: number; after?: number },
): Promise<RunRow[]> {
  return (
    await db.query<RunRow>(
      `SELECT ${columns} FROM agent_runs
       WHERE tenant = $1 AND ($2::text[] IS NULL OR status = ANY($2::text[])) AND ($3::text IS NULL OR class = $3)
         AND ($4::bigint IS NULL OR seq > $4::bigint)
       ORDER BY seq LIMIT $5`,
      [tenant, filter.statuses ?? null, filter.class ?? null, filter.after ?? null, filter.limit],
    )
  ).rows;
}

/** Takes the oldest queued run for a worker of this process; SKIP LOCKED keeps workers apart. */
export async function claimQueuedRun(db: Database, worker: string): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET status = 'running', worker = $1, started_at = clock_timestamp()
       WHERE id = (SELECT id FROM agent_runs WHERE status = 'queued' AND class = 'default' ORDER BY seq
                   FOR UPDATE SKIP LOCKED LIMIT 1)
       RETURNING ${columns}`,
      [worker],
    )
  ).rows[0];
}

/** Ends a running run; a run already ended (canceled meanwhile) is left as it is. */
export async function finishRun(
  db: Database,
  id: string,
  outcome: {
    status: 'succeeded' | 'failed' | 'canceled';
    output?: unknown;
    error?: { type: string; message: string };
    usage?: unknown;
  },
): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET status = $2, output = $3::jsonb, error = $4::jsonb, usage = $5::jsonb, finished_at = clock_timestamp()
       WHERE id = $1 AND status IN ('queued', 'running') RETURNING ${columns}`,
      [
        id,
        outcome.status,
        outcome.output === undefined ? null : JSON.stringify(outcome.output),
        outcome.error ? JSON.stringify(outcome.error) : null,
        outcome.usage === undefined ? null : JSON.stringify(outcome.usage),
      ],
    )
  ).rows[0];
}

/** Queue figures for the queue endpoint: tenant-wide, and for one project. */
export async function queueCounts(db: Database, tenant: string, project: string) {
  const rows = (
    await db.query<{ class: string; status: string; mine: boolean; n: number; oldest: number | null }>(
      `SELECT class, status, project = $2 AS mine, count(*)::int AS n,
              (extract(epoch FROM min(created_at)))::float8 AS oldest
       FROM agent_runs WHERE tenant = $1 AND status IN ('scheduled', 'queued', 'running')
       GROUP BY class, status, project = $2`,
      [tenant, project],
    )
  ).rows;
  const count = (cls: string, status: string, onlyMine = false) =>
    rows
      .filter((r) => r.class === cls && r.status === status && (!onlyMine || r.mine))
      .reduce((a, r) => a + r.n, 0);
  const oldestDeferred = rows
    .filter((r) => r.class === 'deferred' && r.status === 'queued' && r.oldest !== null)
    .reduce<number | null>((a, r) => (a === null ? r.oldest : Math.min(a, r.oldest!)), null);
  return { count, oldestDeferred };
}

/** Records that this node is alive. */
export async function heartbeat(db: Database, node: string): Promise<void> {
  await db.query(
    `INSERT INTO server_nodes (id) VALUES ($1)
     ON CONFLICT (id) DO UPDATE SET heartbeat_at = clock_timestamp()`,
    [node],
  );
}

/**
 * Ends runs whose node stopped heartbeating `staleMs` ago (or never registered): failed,
 * `worker_lost`. Returns how many.
 */
export async function failLostRuns(db: Database, staleMs: number): Promise<number> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs r SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'worker_lost', 'message', 'the server running this run stopped before it finished')
     WHERE r.status = 'running' AND NOT EXISTS (
       SELECT 1 FROM server_nodes n WHERE n.id = r.worker
         AND n.heartbeat_at > clock_timestamp() - $1::float8 * interval '1 millisecond')
     RETURNING r.id`,
    [staleMs],
  );
  return result.rows.length;
}

/** Marks runs of this node that did not finish within the drain time: failed, `interrupted`. */
export async function interruptRuns(db: Database, node: string): Promise<string[]> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'interrupted', 'message', 'the server stopped before this run finished; start it again')
     WHERE status = 'running' AND worker = $1 RETURNING id`,
    [node],
  );
  return result.rows.map((r) => r.id);
}

/**
 * Takes the oldest queued deferred run whose tenant is under its running cap. The tenant's
 * count is taken under its advisory lock, so workers on any process never run more than the
 * cap for one tenant.
 */
export async function claimDeferredRun(
  db: Database,
  worker: string,
  maxRunningPerTenant: number,
): Promise<RunRow | undefined> {
  const skipped: string[] = [];
  for (let attempt = 0; attempt < 20; attempt++) {
    const claimed = await db.transaction(async (tx) => {
      const candidate = (
        await tx.query<{ id: string; tenant: string }>(
          `SELECT id, tenant FROM agent_runs WHERE status = 'queued' AND class = 'deferred' AND NOT (tenant = ANY($1::text[]))
           ORDER BY seq FOR UPDATE SKIP LOCKED LIMIT 1`,
          [skipped],
        )
      ).rows[0];
      if (!candidate) return null;
      await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [
        `sluice:deferred:${candidate.tenant}`,
      ]);
      const running = (
        await tx.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs WHERE tenant = $1 AND class = 'deferred' AND status = 'running'`,
          [candidate.tenant],
        )
      ).rows[0]!.n;
      if (maxRunningPerTenant > 0 && running >= maxRunningPerTenant) return candidate.tenant;
      return (
        await tx.query<RunRow>(
          `UPDATE agent_runs SET status = 'running', worker = $1, started_at = clock_timestamp() WHERE id = $2 RETURNING ${columns}`,
          [worker, candidate.id],
        )
      ).rows[0]!;
    });
    if (claimed === null) return undefined;
    if (typeof claimed === 'string') {
      skipped.push(claimed);
      continue;
    }
    return claimed;
  }
  return undefined;
}

/**
 * Deferred runs still queued, and scheduled runs still not started, `maxWaitMs` after they
 * became due end failed with `expired`.
 */
export async function expireDeferredRuns(db: Database, maxWaitMs: number): Promise<number> {
  const result = await db.query<{ id: string }>(
    `UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp(),
       error = jsonb_build_object('type', 'expired', 'message', 'the run was not started within AGENT_DEFERRED_MAX_WAIT_MS')
     WHERE ((status = 'queued' AND class = 'deferred') OR status = 'scheduled')
       AND coalesce(scheduled_for, created_at) < clock_timestamp() - $1::float8 * interval '1 millisecond'
     RETURNING id`,
    [maxWaitMs],
  );
  return result.rows.length;
}

/**
 * Moves due scheduled runs to their queue: deferred ones at once (their place in the deferred
 * queue was counted when they were accepted), default-class ones only while their tenant and
 * project are under the default-class cap (else they stay scheduled and start later).
 * Returns how many were promoted.
 */
export async function promoteDueRuns(db: Database, capsFor: (tenant: string) => Caps): Promise<number> {
  return db.transaction(async (tx) => {
    const due = (
      await tx.query<{ id: string; tenant: string; project: string; class: string }>(
        `SELECT id, tenant, project, class FROM agent_runs
         WHERE status = 'scheduled' AND scheduled_for <= clock_timestamp()
         ORDER BY scheduled_for, seq LIMIT 100 FOR UPDATE SKIP LOCKED`,
      )
    ).rows;
    let promoted = 0;
    for (const run of due) {
      if (run.class === 'default') {
        await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:tenant:${run.tenant}`]);
        const counts = (
          await tx.query<{ tenant: number; project: number }>(
            `SELECT count(*)::int AS tenant, count(*) FILTER (WHERE project = $2)::int AS project
             FROM agent_runs WHERE tenant = $1 AND class = 'default' AND status IN ('queued', 'running')`,
            [run.tenant, run.project],
          )
        ).rows[0]!;
        const caps = capsFor(run.tenant);
        if (caps.perTenant > 0 && counts.tenant >= caps.perTenant) continue;
        if (caps.perProject > 0 && counts.project >= caps.perProject) continue;
      }
      await tx.query(`UPDATE agent_runs SET status = 'queued' WHERE id = $1`, [run.id]);
      promoted++;
    }
    return promoted;
  });
}
