import type { Database } from '@sluice/postgres/database';
import type { PausedState, ToolDecision } from 'sluice';
import { shown } from '../shown.js';
import { invalidInput } from './refused.js';
import type { RunRow } from './store.js';

/**
 * The check of a resume's answers, and what a resumed run goes on from. The moves themselves
 * are in lifecycle.ts: a run pauses from `running` (`pauseRun`, its worker's write, fenced like
 * a finish), resumes from `requires_action` (`resumeRun`, one compare-and-set: of two resumes
 * at once, one moves it), and ends like any run.
 */

/** A reason goes to the model as a tool result: a note, not a document. */
export const MAX_REASON_CHARS = 4_000;

/** What an API client answers for one pending call. */
export interface Approval {
  tool_call_id: string;
  approved: boolean;
  reason?: string;
}

/**
 * Checks a resume's `approvals` against the run's pending calls: every pending call answered
 * exactly once, nothing else answered. A refusal (`invalid_input`, a 400) names the field (`approvals[1].tool_call_id`).
 */
export function checkApprovals(run: RunRow, approvals: unknown): Approval[] {
  const pending = (run.required_action?.tool_calls ?? []) as { id: string }[];
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
