import { randomBytes } from 'node:crypto';
import type { SqlClient } from '@sluice/postgres/database';
import type { RunClass } from '../runs/lifecycle.js';

/** Triggers in the store (sql/013_triggers.sql). */

export interface TriggerRow {
  id: string;
  tenant: string;
  project: string;
  user_id: string;
  name: string;
  agent: string;
  class: RunClass;
  schedule: string | null;
  input: string | null;
  secret: string;
  /** Epoch ms. */
  created_ms: number;
  last_tick_ms: number | null;
}

const columns = `id, tenant, project, user_id, name, agent, class, schedule, input, secret,
  (extract(epoch FROM created_at) * 1000)::float8 AS created_ms,
  (extract(epoch FROM last_tick_at) * 1000)::float8 AS last_tick_ms`;

export const isTriggerId = (id: string) => /^trg_[0-9a-f]{24}$/.test(id);

export interface NewTrigger {
  tenant: string;
  project: string;
  user: string;
  name: string;
  agent: string;
  class: RunClass;
  schedule?: string;
  /** Epoch ms of the schedule's first tick. */
  nextTickMs?: number;
  input?: string;
  secret: string;
}

export async function insertTrigger(db: SqlClient, t: NewTrigger): Promise<TriggerRow> {
  const rows = await db.query<TriggerRow>(
    `INSERT INTO triggers (id, tenant, project, user_id, name, agent, class, schedule, input, secret, next_tick_at)
     VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text, $9::text, $10::text,
       to_timestamp($11::float8 / 1000))
     RETURNING ${columns}`,
    [
      `trg_${randomBytes(12).toString('hex')}`,
      t.tenant,
      t.project,
      t.user,
      t.name,
      t.agent,
      t.class,
      t.schedule ?? null,
      t.input ?? null,
      t.secret,
      t.nextTickMs ?? null,
    ],
  );
  return rows.rows[0]!;
}

export async function countTriggers(db: SqlClient, tenant: string): Promise<number> {
  return (
    await db.query<{ n: number }>('SELECT count(*)::int AS n FROM triggers WHERE tenant = $1::text', [tenant])
  ).rows[0]!.n;
}

export async function listTriggers(db: SqlClient, tenant: string): Promise<TriggerRow[]> {
  return (
    await db.query<TriggerRow>(
      `SELECT ${columns} FROM triggers WHERE tenant = $1::text ORDER BY created_at, id`,
      [tenant],
    )
  ).rows;
}

/** A trigger by id alone: the webhook route has no tenant until the signature names one. */
export async function findTrigger(db: SqlClient, id: string): Promise<TriggerRow | undefined> {
  if (!isTriggerId(id)) return undefined;
  return (await db.query<TriggerRow>(`SELECT ${columns} FROM triggers WHERE id = $1::text`, [id])).rows[0];
}

export async function deleteTrigger(db: SqlClient, tenant: string, id: string): Promise<boolean> {
  if (!isTriggerId(id)) return false;
  const deleted = await db.query(
    'DELETE FROM triggers WHERE id = $1::text AND tenant = $2::text RETURNING id',
    [id, tenant],
  );
  return deleted.rows.length > 0;
}

/** The run an earlier copy of a delivery made, if any. */
export async function deliveredRun(
  db: SqlClient,
  triggerId: string,
  key: string,
): Promise<string | undefined> {
  return (
    await db.query<{ run_id: string }>(
      'SELECT run_id FROM trigger_deliveries WHERE trigger_id = $1::text AND key = $2::text',
      [triggerId, key],
    )
  ).rows[0]?.run_id;
}

/** Records a delivery beside its run; a second copy fails on the key (and its run with it). */
export async function recordDelivery(
  db: SqlClient,
  triggerId: string,
  key: string,
  runId: string,
): Promise<void> {
  await db.query(
    'INSERT INTO trigger_deliveries (trigger_id, key, run_id) VALUES ($1::text, $2::text, $3::text)',
    [triggerId, key, runId],
  );
}

/** Schedule triggers whose next tick has come by `nowMs` (at most `limit`, the longest due first). */
export async function dueTriggers(db: SqlClient, nowMs: number, limit: number): Promise<TriggerRow[]> {
  return (
    await db.query<TriggerRow>(
      `SELECT ${columns} FROM triggers
       WHERE schedule IS NOT NULL AND next_tick_at <= to_timestamp($1::float8 / 1000)
       ORDER BY next_tick_at LIMIT $2::int`,
      [nowMs, limit],
    )
  ).rows;
}

/** The earliest next tick of any schedule trigger, epoch ms; null when there is none. */
export async function earliestTick(db: SqlClient): Promise<number | null> {
  const { rows } = await db.query<{ at: number | null }>(
    `SELECT (extract(epoch FROM min(next_tick_at)) * 1000)::float8 AS at FROM triggers WHERE schedule IS NOT NULL`,
  );
  return rows[0]?.at ?? null;
}

/**
 * Claims a tick: its row, and the trigger's latest tick moved to it. Throws a unique violation
 * when another process made it first (its transaction, run included, is then rolled back).
 */
export async function recordTick(
  db: SqlClient,
  triggerId: string,
  tickMs: number,
  nextTickMs: number | undefined,
  outcome: { runId: string } | { refused: string },
): Promise<void> {
  await db.query(
    `INSERT INTO trigger_ticks (trigger_id, tick, run_id, refused)
     VALUES ($1::text, to_timestamp($2::float8 / 1000), $3::text, $4::text)`,
    [
      triggerId,
      tickMs,
      'runId' in outcome ? outcome.runId : null,
      'refused' in outcome ? outcome.refused : null,
    ],
  );
  await db.query(
    `UPDATE triggers SET last_tick_at = greatest(last_tick_at, to_timestamp($2::float8 / 1000)),
       next_tick_at = to_timestamp($3::float8 / 1000)
     WHERE id = $1::text`,
    [triggerId, tickMs, nextTickMs ?? null],
  );
}

/** Whether another process has made this tick already (a cheap look before taking the tenant's lock). */
export async function tickMade(db: SqlClient, triggerId: string, tickMs: number): Promise<boolean> {
  return (
    (
      await db.query(
        'SELECT 1 FROM trigger_ticks WHERE trigger_id = $1::text AND tick = to_timestamp($2::float8 / 1000)',
        [triggerId, tickMs],
      )
    ).rows.length > 0
  );
}

/** Tick rows past their use (older ticks are never made again: `last_tick_at` remembers). */
export async function pruneTicks(db: SqlClient, olderThanMs: number): Promise<void> {
  await db.query(
    `DELETE FROM trigger_ticks WHERE created_at < clock_timestamp() - $1::float8 * interval '1 millisecond'`,
    [olderThanMs],
  );
}

export const isUniqueViolation = (error: unknown) => (error as { code?: string })?.code === '23505';
