import type { Database } from '@sluice/postgres/database';
import type { PausedState, PendingToolCall, ToolDecision } from 'sluice';
import { badRequest, shown } from '../http/errors.js';
import { toJsonb } from './json.js';
import { full, type RunRow } from './store.js';

/**
 * Every SQL statement of approvals, and the check of a resume's answers. A run pauses from
 * `running` (its worker's write, fenced like a finish), resumes from `requires_action` (one
 * compare-and-set: of two resumes at once, one moves it), and ends like any run.
 */

/** A reason goes to the model as a tool result: a note, not a document. */
export const MAX_REASON_CHARS = 4_000;

/** What an API client answers for one pending call. */
export interface Approval {
  tool_call_id: string;
  approved: boolean;
  reason?: string;
}

/** What a run that paused writes. */
export interface Pause {
  status: 'requires_action';
  pending: PendingToolCall[];
  state: PausedState;
  usage?: unknown;
}

/**
 * Pauses a run this process executes: no worker from now on, the pending calls shown, the
 * paused state kept. Its thread stays held for as long as it waits (a lease without end: no
 * process renews it, and cancel or the run's end frees it). Waiting callers are woken, as a
 * run that needs a person has answered them for now.
 */
export async function pauseRun(
  db: Database,
  id: string,
  worker: string,
  pause: Pause,
): Promise<RunRow | undefined> {
  const requiredAction = {
    type: 'approve_tool_calls',
    tool_calls: pause.pending.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })),
  };
  const paused = (
    await db.query<RunRow>(
      // A cancel asked for from another process that this one has not acted on yet wins: the
      // run ends canceled rather than wait for a person who could then approve the call.
      `WITH paused AS (
         UPDATE agent_runs SET
           status = CASE WHEN cancel_requested_at IS NULL THEN 'requires_action' ELSE 'canceled' END,
           finished_at = CASE WHEN cancel_requested_at IS NULL THEN finished_at ELSE clock_timestamp() END,
           worker = NULL,
           required_action = CASE WHEN cancel_requested_at IS NULL THEN $3::jsonb END,
           paused_state = CASE WHEN cancel_requested_at IS NULL THEN $4::jsonb END,
           approvals = NULL, usage = $5::jsonb
         WHERE id = $1::text AND status = 'running' AND worker = $2::text RETURNING ${full}),
       kept AS (
         UPDATE threads SET lock_expires_at = 'infinity'
         WHERE active_run_id = $1::text AND EXISTS (SELECT 1 FROM paused WHERE status = 'requires_action')
         RETURNING id)
       SELECT * FROM paused`,
      [id, worker, toJsonb(requiredAction), toJsonb(pause.state), toJsonb(pause.usage)],
    )
  ).rows[0];
  // Callers waiting on other processes re-read the run ('end' wakes them; it is not final).
  if (paused)
    await db.query(`SELECT pg_notify('sluice_runs', 'end:' || $1::text)`, [id]).catch(() => undefined);
  return paused;
}

/**
 * Checks a resume's `approvals` against the run's pending calls: every pending call answered
 * exactly once, nothing else answered. A 400 names the field (`approvals[1].tool_call_id`).
 */
export function checkApprovals(run: RunRow, approvals: unknown): Approval[] {
  const pending = (run.required_action?.tool_calls ?? []) as { id: string }[];
  const ids = pending.map((c) => c.id);
  if (!Array.isArray(approvals))
    throw badRequest(`Expected \`approvals\` to be a list, got \`${shown(approvals)}\``, {
      field: 'approvals',
    });
  const seen = new Set<string>();
  approvals.forEach((a: unknown, i) => {
    const at = `approvals[${i}]`;
    const { tool_call_id: id, approved, reason } = (a ?? {}) as Record<string, unknown>;
    if (typeof id !== 'string' || !ids.includes(id)) {
      throw badRequest(
        `Expected \`${at}.tool_call_id\` to be one of the pending calls of run ${run.id} (${ids.join(', ')}), got \`${shown(id)}\``,
        { field: `${at}.tool_call_id`, pending: ids },
      );
    }
    if (seen.has(id)) {
      throw badRequest(`\`${at}.tool_call_id\` answers \`${id}\` a second time; answer each call once`, {
        field: `${at}.tool_call_id`,
      });
    }
    seen.add(id);
    if (typeof approved !== 'boolean')
      throw badRequest(`Expected \`${at}.approved\` to be true or false, got \`${shown(approved)}\``, {
        field: `${at}.approved`,
      });
    if (reason !== undefined && (typeof reason !== 'string' || reason.length > MAX_REASON_CHARS))
      throw badRequest(
        `Expected \`${at}.reason\` to be a string of at most ${MAX_REASON_CHARS} characters, got \`${shown(reason)}\``,
        { field: `${at}.reason`, limit_value: MAX_REASON_CHARS },
      );
  });
  const missing = ids.filter((id) => !seen.has(id));
  if (missing.length > 0) {
    throw badRequest(`\`approvals\` has no answer for ${missing.join(', ')}; answer every pending call`, {
      field: 'approvals',
      missing,
    });
  }
  return approvals as Approval[];
}

/**
 * Moves a paused run back to the queue with its answers (compare-and-set on `requires_action`
 * and on the pending calls the answers were checked against: undefined when it was not paused
 * any more, e.g. another resume came first, or when it paused again since, on calls a person
 * has not seen; models reuse call ids, so an id match alone proves nothing). It keeps its
 * place in the queue (its admission order) and its thread, and passes no admission check:
 * it is work that was accepted already.
 */
export async function resumeRun(
  db: Database,
  tenant: string,
  id: string,
  approvals: Approval[],
  checked: RunRow['required_action'],
): Promise<RunRow | undefined> {
  return (
    await db.query<RunRow>(
      `UPDATE agent_runs SET status = 'queued', mode = 'queued', worker = NULL, required_action = NULL,
         approvals = $3::jsonb
       WHERE id = $1::text AND tenant = $2::text AND status = 'requires_action'
         AND required_action = $4::jsonb
       RETURNING ${full}`,
      [id, tenant, toJsonb(approvals), toJsonb(checked)],
    )
  ).rows[0];
}

/** What a resumed run goes on from: its paused state and the answers, as the runtime takes them. */
export async function resumption(
  db: Database,
  id: string,
): Promise<{ paused: PausedState; decisions: ToolDecision[] } | undefined> {
  const row = (
    await db.query<{ paused_state: PausedState | null; approvals: Approval[] | null }>(
      'SELECT paused_state, approvals FROM agent_runs WHERE id = $1::text',
      [id],
    )
  ).rows[0];
  if (!row?.paused_state || !row.approvals) return undefined;
  return {
    paused: row.paused_state,
    decisions: row.approvals.map((a) => ({
      toolCallId: a.tool_call_id,
      approved: a.approved,
      ...(a.reason === undefined ? {} : { reason: a.reason }),
    })),
  };
}
