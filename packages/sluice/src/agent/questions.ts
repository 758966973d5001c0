import type { ToolResultMessage } from '@mariozechner/pi-ai';
import type { PendingToolCall } from './approvals.js';
import { tool } from './tool.js';

/**
 * Questions for a person: a call of a tool defined with `ask: true` is not run but asked, and
 * the person's answer becomes its result. The run pauses on it as it does for an approval.
 */

/**
 * A ready-made tool the model calls to ask the user something (`ask_human`, one `question`
 * string): give it to `createAgent({ tools })` and the run pauses on each call until
 * `agent.resume()` brings the answer.
 */
export const askHuman = tool<{ question: string }>({
  name: 'ask_human',
  description:
    'Ask the user a question and wait for the answer. Use it when you need a fact, a choice or a confirmation that only the user can give.',
  parameters: {
    type: 'object',
    properties: { question: { type: 'string', description: 'The question, as the user will read it' } },
    required: ['question'],
  },
  ask: true,
});

/** What a person is asked: the call's `question` argument when it is a string, else its arguments as JSON. */
export function questionOf(args: Record<string, unknown>): string {
  return typeof args.question === 'string' ? args.question : JSON.stringify(args);
}

/** The result the model sees for a question once a person has answered it. */
export function answeredResult(call: PendingToolCall, answer: string, now: number): ToolResultMessage {
  return {
    role: 'toolResult',
    toolCallId: call.id,
    toolName: call.name,
    content: [{ type: 'text', text: answer }],
    isError: false,
    timestamp: now,
  };
}
