import type { Database } from '@sluice/postgres/database';
import type { PausedState, ToolDecision } from 'sluice';
import { shown } from '../shown.js';
import { recordDecisions, resumeRun } from './lifecycle.js';
import { invalidInput } from './refused.js';
import { isAnswer, requiredActionOf, type Approval, type Decision } from './required-action.js';
import type { RunRow } from './store.js';

export type { Approval } from './required-action.js';

/**
 * The check of a resume's approvals, the decisions of a paused run as they add up, and what a
 * resumed run goes on from. The moves themselves are in lifecycle.ts: a run pauses from
 * `running` (`pauseRun`, its worker's write, fenced like a finish), takes decisions stage by
 * stage while in `requires_action` (`recordDecisions`), resumes from it once all are given
 * (`resumeRun`, one compare-and-set: of two resumes at once, one moves it), and ends like any
 * run. Answers to questions are checked in answers.ts.
 */

/** A reason goes to the model as a tool result: a note, not a document. */
export const MAX_REASON_CHARS = 4_000;

/**
 * Checks a resume's `approvals` against the run's pending calls: every pending call answered
 * exactly once, nothing else answered. A refusal (`invalid_input`, a 400) names the field (`approvals[1].tool_call_id`).
 */
export function checkApprovals(run: RunRow, approvals: unknown): Approval[] {
  const action = run.required_action;
  const pending = action?.type === 'approve_tool_calls' ? action.tool_calls : [];
  const ids = pending.map((c) => c.id);
  if (!Array.isArray(approvals))
    throw invalidInput(`Expected \`approvals\` to be a list, got \`${shown(approvals)}\``, 'approvals');
  const seen = new Set<string>();
  approvals.forEach((a: unknown, i) => {
    const at = `approvals[${i}]`;
    const { tool_call_id: id, approved, reason } = (a ?? {}) as Record<string, unknown>;
    if (typeof id !== 'string' || !ids.includes(id)) {
      throw invalidInput(
        `Expected \`${at}.tool_call_id\` to be one of the pending calls of run ${run.id} (${ids.join(', ')}), got \`${shown(id)}\``,
        `${at}.tool_call_id`,
        { pending: ids },
      );
    }
    if (seen.has(id)) {
      throw invalidInput(
        `\`${at}.tool_call_id\` answers \`${id}\` a second time; answer each call once`,
        `${at}.tool_call_id`,
      );
    }
    seen.add(id);
    if (typeof approved !== 'boolean')
      throw invalidInput(
        `Expected \`${at}.approved\` to be true or false, got \`${shown(approved)}\``,
        `${at}.approved`,
      );
    if (reason !== undefined && (typeof reason !== 'string' || reason.length > MAX_REASON_CHARS))
      throw invalidInput(
        `Expected \`${at}.reason\` to be a string of at most ${MAX_REASON_CHARS} characters, got \`${shown(reason)}\``,
        `${at}.reason`,
        { limitValue: MAX_REASON_CHARS },
      );
  });
  const missing = ids.filter((id) => !seen.has(id));
  if (missing.length > 0) {
    throw invalidInput(
      `\`approvals\` has no answer for ${missing.join(', ')}; answer every pending call`,
      'approvals',
      {
        missing,
      },
    );
  }
  return approvals as Approval[];
}

async function pausedRow(db: Database, id: string) {
  return (
    await db.query<{ paused_state: PausedState | null; approvals: Decision[] | null }>(
      'SELECT paused_state, approvals FROM agent_runs WHERE id = $1::text',
      [id],
    )
  ).rows[0];
}

/**
 * Adds checked decisions (those of the stage `run` showed) to the ones given before, then moves
 * the run: on to its next stage when calls are left to decide, back to the queue when none are.
 * Undefined when the run was not at that stage any more (another resume or a cancel came first).
 */
export async function decide(
  db: Database,
  run: RunRow,
  decisions: readonly Decision[],
): Promise<{ run: RunRow; resumed: boolean } | undefined> {
  const row = await pausedRow(db, run.id);
  if (!row?.paused_state) return undefined;
  const decided = [...(row.approvals ?? []), ...decisions];
  const next = requiredActionOf(row.paused_state.pending, decided);
  if (next) {
    const waiting = await recordDecisions(db, run.tenant, run.id, decided, run.required_action, next);
    return waiting && { run: waiting, resumed: false };
  }
  const resumed = await resumeRun(db, run.tenant, run.id, decided, run.required_action);
  return resumed && { run: resumed, resumed: true };
}

/** What a resumed run goes on from: its paused state and the decisions, as the runtime takes them. */
export async function resumption(
  db: Database,
  id: string,
): Promise<{ paused: PausedState; decisions: ToolDecision[] } | undefined> {
  const row = await pausedRow(db, id);
  if (!row?.paused_state || !row.approvals) return undefined;
  return {
    paused: row.paused_state,
    decisions: row.approvals.map((d): ToolDecision => {
      if (isAnswer(d)) return { toolCallId: d.tool_call_id, answer: d.text };
      return {
        toolCallId: d.tool_call_id,
        approved: d.approved,
        ...(d.reason === undefined ? {} : { reason: d.reason }),
      };
    }),
  };
}
