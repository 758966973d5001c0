import { shown } from '../shown.js';
import { isUnstorable } from './json.js';
import { invalidInput } from './refused.js';
import type { Answer } from './required-action.js';
import type { RunRow } from './store.js';

/**
 * The check of a resume's `answers` to a run waiting in `answer_question`. Some of the open
 * questions may be answered now and the rest later: the run goes on once all are. Nothing
 * else may be answered, and no question twice.
 */

/** An answer is a tool result the model reads: a person's reply, not a document. */
export const MAX_ANSWER_CHARS = 32_000;

/** Checks `answers` against the run's open questions; a refusal (a 400) names the field. */
export function checkAnswers(run: RunRow, answers: unknown): Answer[] {
  const action = run.required_action;
  const open = action?.type === 'answer_question' ? action.questions.map((q) => q.tool_call_id) : [];
  if (!Array.isArray(answers) || answers.length === 0) {
    throw invalidInput(
      `Expected \`answers\` to be a non-empty list of \`{ tool_call_id, text }\`, got \`${shown(answers)}\``,
      'answers',
      { pending: open },
    );
  }
  const seen = new Set<string>();
  return answers.map((a: unknown, i): Answer => {
    const at = `answers[${i}]`;
    const { tool_call_id: id, text } = (a ?? {}) as Record<string, unknown>;
    if (typeof id !== 'string' || !open.includes(id)) {
      throw invalidInput(
        `Expected \`${at}.tool_call_id\` to be one of the open questions of run ${run.id} (${open.join(', ')}), got \`${shown(id)}\``,
        `${at}.tool_call_id`,
        { pending: open },
      );
    }
    if (seen.has(id))
      throw invalidInput(
        `\`${at}.tool_call_id\` answers \`${id}\` a second time; answer each question once`,
        `${at}.tool_call_id`,
      );
    seen.add(id);
    if (
      typeof text !== 'string' ||
      text.trim() === '' ||
      text.length > MAX_ANSWER_CHARS ||
      isUnstorable(text)
    ) {
      throw invalidInput(
        `Expected \`${at}.text\` to be the answer, a non-blank string of at most ${MAX_ANSWER_CHARS} characters with no U+0000, got \`${shown(text)}\``,
        `${at}.text`,
        { limitValue: MAX_ANSWER_CHARS },
      );
    }
    return { tool_call_id: id, text };
  });
}
