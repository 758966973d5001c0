import { HttpError, badRequest } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import { storableText } from '../http/schemas.js';

/**
 * An AG-UI `RunAgentInput` as this server reads it. AG-UI clients resend the whole conversation
 * on every run: the messages after the last assistant message (the trailing turn) are what is
 * asked now, and get the per-request limits; the history before them may be longer (10,000
 * messages in all), and the whole body still counts against the 10 MB body limit.
 */

/** Messages a resent conversation may hold in all. */
export const MAX_HISTORY_MESSAGES = 10_000;

const text = { type: 'string', pattern: storableText } as const;
const id = { type: 'string', minLength: 1, maxLength: 200 } as const;

/** A part of a message's content: text is read; other parts (images, files) are counted, not read. */
const contentPart = {
  type: 'object',
  required: ['type'],
  maxProperties: 16,
  properties: { type: { type: 'string', maxLength: 50 } },
  if: { properties: { type: { const: 'text' } } },
  then: { required: ['type', 'text'], properties: { text } },
} as const;

const message = {
  type: 'object',
  required: ['id', 'role'],
  // AG-UI adds optional keys between versions (metadata, encryptedValue...): read what we use.
  maxProperties: 32,
  properties: {
    id,
    role: {
      type: 'string',
      enum: ['developer', 'system', 'assistant', 'user', 'tool', 'activity', 'reasoning'],
    },
    content: {
      anyOf: [
        text,
        // Past 100 parts in the trailing turn the answer is 413; this bound only keeps validation cheap.
        { type: 'array', maxItems: 100_000, items: contentPart },
        { type: 'object' },
      ],
    },
    name: { type: 'string', maxLength: 200 },
    toolCallId: { type: 'string', maxLength: 200 },
    toolCalls: { type: 'array', maxItems: 1_000, items: { type: 'object' } },
  },
} as const;

export const runAgentInputSchema = {
  type: 'object',
  required: ['threadId', 'runId', 'messages'],
  maxProperties: 32,
  properties: {
    threadId: id,
    runId: id,
    parentRunId: id,
    protocolVersion: { type: 'string', maxLength: 50 },
    state: {},
    // Past 10,000 the answer is 413 (counted below); this bound only keeps validation cheap.
    messages: { type: 'array', maxItems: 100_000, items: message },
    tools: { type: 'array', maxItems: 1_000, items: { type: 'object' } },
    context: { type: 'array', maxItems: 1_000, items: { type: 'object' } },
    forwardedProps: {},
    resume: { type: 'array', maxItems: 1_000 },
  },
} as const;

type Part = { type: string; text?: string };
export interface AgUiMessage {
  id: string;
  role: 'developer' | 'system' | 'assistant' | 'user' | 'tool' | 'activity' | 'reasoning';
  content?: string | Part[] | Record<string, unknown>;
}

export interface RunAgentInput {
  threadId: string;
  runId: string;
  messages: AgUiMessage[];
  /** @ag-ui/core 1.0's answers to the interrupts of the thread's paused run (checked in resume.ts). */
  resume?: unknown[];
}

type SluiceMessage = {
  role: 'user' | 'assistant' | 'system';
  content: string | { type: 'text'; text: string }[];
};

/** The text of a message's content: a string, or its text parts in order; objects (activity) have none. */
function textBlocks(content: AgUiMessage['content']): { type: 'text'; text: string }[] {
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  if (!Array.isArray(content)) return [];
  return content.filter((p) => p.type === 'text' && p.text).map((p) => ({ type: 'text', text: p.text! }));
}

const roleOf = (role: AgUiMessage['role']): SluiceMessage['role'] | undefined =>
  role === 'developer' || role === 'system'
    ? 'system'
    : role === 'user' || role === 'assistant'
      ? role
      : undefined;

/** A message as a run reads it, or undefined when it holds nothing a run reads (tool calls, activity, no text). */
function toSluice(m: AgUiMessage): SluiceMessage | undefined {
  const role = roleOf(m.role);
  const blocks = textBlocks(m.content);
  if (role === undefined || blocks.length === 0) return undefined;
  return { role, content: typeof m.content === 'string' ? m.content : blocks };
}

/** The trailing turn (from `start` in `messages`) against the per-request limits; the field named in the whole list. */
function countTurn(turn: AgUiMessage[], start: number): void {
  const counted = turn.map((m) => ({
    role: m.role,
    content: Array.isArray(m.content)
      ? m.content.map((p) => ({ type: 'text', text: p.type === 'text' ? (p.text ?? '') : '' }))
      : typeof m.content === 'string'
        ? m.content
        : '',
  }));
  try {
    checkInput(counted, 'messages');
  } catch (error) {
    const field = error instanceof HttpError ? error.details.field : undefined;
    const at = typeof field === 'string' ? /^messages\.(\d+)\.(.*)$/.exec(field) : null;
    if (!at) throw error;
    const where = `messages.${start + Number(at[1])}.${at[2]}`;
    throw new HttpError(
      error instanceof HttpError ? error.status : 413,
      'request_too_large',
      (error as Error).message.replace(field as string, where),
      {
        ...(error as HttpError).details,
        field: where,
      },
    );
  }
}

/**
 * Splits a resent conversation into its history and its trailing turn, counting each against
 * its limits (413 `request_too_large` naming the limit). The turn is the run's input: its user,
 * system and developer messages with their text; tool results for tools the client ran and
 * other non-text messages are not read (this server runs only its own tools).
 */
export function splitConversation(messages: AgUiMessage[]): {
  history: SluiceMessage[];
  turn: SluiceMessage[];
} {
  if (messages.length > MAX_HISTORY_MESSAGES) {
    throw new HttpError(
      413,
      'request_too_large',
      `\`messages\` has ${messages.length} messages; the limit for a resent conversation is ${MAX_HISTORY_MESSAGES}`,
      { limit: 'messages', limit_value: MAX_HISTORY_MESSAGES, value: messages.length, field: 'messages' },
    );
  }
  let start = messages.length;
  while (start > 0 && messages[start - 1]!.role !== 'assistant') start -= 1;
  const turn = messages.slice(start);
  // Counted as sent: every message and every part of the turn, whether or not a run reads it.
  countTurn(turn, start);
  const input = turn
    .map(toSluice)
    .filter((m): m is SluiceMessage => m !== undefined && m.role !== 'assistant');
  if (!input.some((m) => m.role === 'user'))
    throw badRequest(
      'The messages after the last assistant message hold no user message with text; nothing is asked',
      {
        field: 'messages',
      },
    );
  const history = messages
    .slice(0, start)
    .map(toSluice)
    .filter((m): m is SluiceMessage => m !== undefined);
  return { history, turn: input };
}
