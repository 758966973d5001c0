import type { AgentTool } from '@mariozechner/pi-agent-core';
import { validateToolArguments, type AssistantMessage, type ToolCall } from '@mariozechner/pi-ai';
import { RepairLimitError, type RunErrorFields } from './errors.js';
import type { JsonSchema } from './tool.js';

/**
 * Counts a run's corrective turns: a turn whose tool calls name an unknown tool or fail their
 * schema, or a final answer that fails `run({ schema })`. Past `max`, the run ends with
 * `RepairLimitError`.
 */
export class RepairCounter {
  readonly #max: number;
  readonly #fields: RunErrorFields;
  #used = 0;
  #exhausted: RepairLimitError | undefined;

  constructor(max: number, fields: RunErrorFields) {
    this.#max = max;
    this.#fields = fields;
  }

  /** Takes one corrective turn for `problem`; false once they are spent (the run must stop). */
  take(problem: string): boolean {
    if (this.#used >= this.#max) {
      this.#exhausted ??= new RepairLimitError({
        ...this.#fields,
        repairs: this.#used,
        lastProblem: problem,
      });
      return false;
    }
    this.#used++;
    return true;
  }

  /** Set once a corrective turn was needed and none was left. */
  get exhausted(): RepairLimitError | undefined {
    return this.#exhausted;
  }
}

/**
 * What is wrong with a turn's tool calls, if anything: an unknown tool or arguments that fail
 * its schema. pi-agent-core answers each with an error result, which is the correction.
 */
export function toolCallProblem(
  message: AssistantMessage,
  tools: ReadonlyMap<string, AgentTool>,
): string | undefined {
  for (const call of message.content.filter((c): c is ToolCall => c.type === 'toolCall')) {
    const t = tools.get(call.name);
    if (!t) return `unknown tool \`${call.name}\``;
    try {
      validateToolArguments(t, call);
    } catch (error) {
      return `arguments of \`${call.name}\` do not match its schema: ${(error as Error).message}`;
    }
  }
  return undefined;
}

/** Models often wrap JSON in a Markdown fence; take what is inside. */
export function stripFence(text: string): string {
  const match = /^\s*```(?:json)?\s*\n([\s\S]*?)\n?```\s*$/.exec(text);
  return match ? match[1]! : text;
}

/** A final answer checked against `run({ schema })`: the parsed value, or what is wrong. */
export type AnswerCheck =
  { readonly ok: true; readonly data: unknown } | { readonly ok: false; readonly problem: string };

/** Parses a final answer as JSON (fenced or not) and validates it against `schema`. */
export function checkAnswer(text: string, schema: JsonSchema): AnswerCheck {
  try {
    const data = validateToolArguments(
      { name: 'answer', description: 'the final answer', parameters: schema as never },
      { type: 'toolCall', id: 'answer', name: 'answer', arguments: JSON.parse(stripFence(text)) },
    );
    return { ok: true, data };
  } catch (error) {
    return {
      ok: false,
      problem:
        error instanceof SyntaxError ? `the answer is not JSON (${error.message})` : (error as Error).message,
    };
  }
}

/** What the model is told when its final answer cannot be used. */
export function answerCorrection(problem: string, schema: JsonSchema): string {
  return `Your answer cannot be used: ${problem}. Reply with only a JSON value that matches this JSON Schema: ${JSON.stringify(schema)}`;
}
