import type { PendingToolCall } from 'sluice';

/**
 * What a paused run waits for, as the API shows it. A run pauses once, on every call of the
 * model's turn that waits for a person, and asks for them in stages: first the approvals, then
 * the answers to its questions. Each stage is one required action, and a resume answers the
 * stage shown, never the other: the calls of the turn run (or are answered) only once every
 * one of them is decided, so what a person approves never runs before the questions of the same
 * turn are answered.
 */
export type RequiredAction =
  | { type: 'approve_tool_calls'; tool_calls: ToolCallToApprove[] }
  | {
      type: 'answer_question';
      /** The first question still open, so a client that handles one at a time needs no list. */
      tool_call_id: string;
      question: string;
      /** Every question still open, the first included. */
      questions: OpenQuestion[];
    };

export interface ToolCallToApprove {
  id: string;
  name: string;
  arguments: Record<string, unknown>;
}

export interface OpenQuestion {
  tool_call_id: string;
  name: string;
  question: string;
}

/** What an API client answers for one call waiting for approval. */
export interface Approval {
  tool_call_id: string;
  approved: boolean;
  reason?: string;
}

/** What an API client answers to one question: the text is the call's result. */
export interface Answer {
  tool_call_id: string;
  text: string;
}

/** A decision a resume gave, as the run keeps it (in `agent_runs.approvals`) until it goes on. */
export type Decision = Approval | Answer;

export const isAnswer = (d: Decision): d is Answer => 'text' in d;

/**
 * The stage a paused run is at: the approvals not given yet, else the questions not answered
 * yet; undefined once every pending call is decided (the run can go on).
 */
export function requiredActionOf(
  pending: readonly PendingToolCall[],
  decided: readonly Decision[],
): RequiredAction | undefined {
  const done = new Set(decided.map((d) => d.tool_call_id));
  const open = pending.filter((c) => !done.has(c.id));
  const toApprove = open.filter((c) => c.kind !== 'question');
  if (toApprove.length > 0) {
    return {
      type: 'approve_tool_calls',
      tool_calls: toApprove.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })),
    };
  }
  const questions = open.map((c) => ({
    tool_call_id: c.id,
    name: c.name,
    question: c.question ?? JSON.stringify(c.arguments),
  }));
  const [first] = questions;
  if (!first) return undefined;
  return { type: 'answer_question', tool_call_id: first.tool_call_id, question: first.question, questions };
}

/**
 * Whether `now` is a later stage of the pause `before` showed, with nothing new to decide: its
 * questions are some of those asked before, word for word. A resume checked against `before`
 * that lost a race to another partial answer may be checked again against `now`; against any
 * other stage it may not (models reuse call ids, so a stale answer could fit a new call).
 */
export function continues(before: RequiredAction | null, now: RequiredAction | null): boolean {
  if (before?.type !== 'answer_question' || now?.type !== 'answer_question') return false;
  const asked = new Map(before.questions.map((q) => [q.tool_call_id, q.question]));
  return (
    now.questions.length < before.questions.length &&
    now.questions.every((q) => asked.get(q.tool_call_id) === q.question)
  );
}
