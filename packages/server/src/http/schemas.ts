/**
 * The JSON Schemas of the routes. Fastify validates every request against them before a
 * handler runs (no coercion, unknown fields refused), and the OpenAPI document is generated
 * from them. Limits that the spec answers with 413 rather than 400 (messages, content blocks,
 * characters) are counted in http/limits.ts instead, so they can answer as the spec says.
 */

import { MAX_TIMER_MS } from '../units.js';

/** RFC 3339 with an explicit offset: a time that means the same on every server. */
const rfc3339 = '^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d{1,9})?(Z|[+-]\\d{2}:\\d{2})$';
/**
 * Text jsonb can store: no U+0000 and no unpaired UTF-16 surrogate (Ajv compiles patterns
 * with the `u` flag, where a well-formed pair is one code point outside \p{Cs}).
 */
export const storableText = '^[^\\u0000\\p{Cs}]*$';
/** Whole numbers as the query string carries them: 1 or more, without a sign or a point. */
const positiveInteger = '^0*[1-9][0-9]{0,29}$';
export const MAX_DELAY_SECONDS = 365 * 24 * 3600;

const textBlock = {
  type: 'object',
  required: ['type', 'text'],
  additionalProperties: false,
  properties: {
    type: { type: 'string', enum: ['text', 'input_text'] },
    text: { type: 'string', pattern: storableText },
  },
} as const;

/** An image: an uploaded file's id, or a data: URL (media/parts.ts checks which, and the URL). */
const imageBlock = {
  type: 'object',
  required: ['type'],
  additionalProperties: false,
  properties: {
    type: { type: 'string', enum: ['input_image'] },
    file_id: { type: 'string', minLength: 1, maxLength: 200 },
    image_url: { type: 'string', minLength: 1 },
    detail: { type: 'string', enum: ['auto', 'low', 'high'] },
  },
} as const;

/** A content block: text (`text` or the Responses API's `input_text`), or an `input_image`. */
const contentBlock = {
  type: 'object',
  required: ['type'],
  properties: { type: { type: 'string', enum: ['text', 'input_text', 'input_image'] } },
  if: { properties: { type: { const: 'input_image' } } },
  then: imageBlock,
  else: textBlock,
} as const;

export const messageSchema = {
  type: 'object',
  required: ['role', 'content'],
  additionalProperties: false,
  properties: {
    // The Responses API's input items say `type: 'message'`; the runs API takes them as they are.
    type: { type: 'string', enum: ['message'] },
    role: { type: 'string', enum: ['user', 'assistant', 'system'] },
    content: {
      anyOf: [
        { type: 'string', minLength: 1, pattern: storableText },
        // Past 100 blocks the answer is 413 (http/limits.ts); this bound only keeps validation cheap.
        { type: 'array', minItems: 1, maxItems: 100_000, items: contentBlock },
      ],
    },
  },
} as const;

export const metadataSchema = {
  type: 'object',
  maxProperties: 16,
  propertyNames: { type: 'string', minLength: 1, maxLength: 64, pattern: storableText },
  additionalProperties: {
    anyOf: [
      { type: 'string', maxLength: 512, pattern: storableText },
      { type: 'number' },
      { type: 'boolean' },
      { type: 'null' },
    ],
  },
  description:
    'Up to 16 keys of at most 64 characters; values are strings of at most 512 characters, numbers, booleans or null.',
} as const;

const runInput = {
  description:
    'A non-empty string, or a list of messages (at most 500, with at most 100 content blocks each).',
  anyOf: [
    { type: 'string', minLength: 1, pattern: storableText },
    { type: 'array', minItems: 1, maxItems: 100_000, items: messageSchema },
  ],
} as const;

/** A duration a client may set: whole milliseconds, or null / 0 for none of its own. */
const optionalDuration = { type: ['integer', 'null'], minimum: 0, maximum: MAX_TIMER_MS } as const;

export const threadIdSchema = { type: 'string', minLength: 1, maxLength: 100 } as const;

export const createRunBody = {
  type: 'object',
  additionalProperties: false,
  properties: {
    input: runInput,
    messages: {
      description: "The run's messages, instead of `input`: `[{ role, content }]`.",
      type: 'array',
      minItems: 1,
      maxItems: 100_000,
      items: messageSchema,
    },
    class: { type: 'string', enum: ['default', 'deferred'] },
    wait: {
      type: 'boolean',
      description:
        'Hold the call until the run ends (at most AGENT_SYNC_TIMEOUT_MS). Default: true for the default class, false for deferred.',
    },
    run_at: {
      description:
        'When the run becomes due: RFC 3339 with an offset, or epoch seconds; at most one year ahead.',
      anyOf: [
        // The pattern asks for the offset; the format checks the calendar (no 30 February).
        { type: 'string', maxLength: 40, pattern: rfc3339, format: 'date-time' },
        { type: 'integer', minimum: 0, maximum: 253_402_300_799 },
      ],
    },
    delay_seconds: { type: 'number', minimum: 0, maximum: MAX_DELAY_SECONDS },
    metadata: metadataSchema,
    callback_url: { type: 'string', minLength: 1, maxLength: 2048 },
    thread_id: { ...threadIdSchema, description: "Continue this thread's conversation." },
    on_busy: {
      type: 'string',
      enum: ['wait', 'cancel'],
      description: 'When the thread is busy: wait for its run (default), or cancel it first.',
    },
    stream: { type: 'boolean', description: 'Answer with Server-Sent Events as the run goes.' },
    on_disconnect: {
      type: 'string',
      enum: ['continue', 'cancel'],
      description: 'What a held run does when its caller goes away (default: continue).',
    },
    config: {
      type: 'object',
      additionalProperties: false,
      properties: {
        timeout_ms: optionalDuration,
        tool_timeout_ms: optionalDuration,
        turn_timeout_ms: optionalDuration,
        max_parallel_tool_calls: { type: 'integer', minimum: 1, maximum: 10_000 },
      },
      description:
        "The run's bounds. Each can only tighten the server's: a larger `max_parallel_tool_calls` or `timeout_ms` is lowered to the server's.",
    },
  },
} as const;

export const createThreadBody = {
  type: ['object', 'null'],
  additionalProperties: false,
  properties: { metadata: metadataSchema },
} as const;

export const threadParams = {
  type: 'object',
  required: ['id'],
  properties: { id: { type: 'string', maxLength: 500 } },
} as const;

const pageQuery = {
  limit: {
    type: 'string',
    pattern: positiveInteger,
    description: 'Rows per page: 1 to 1000 (larger values give 1000). Default 100.',
  },
  cursor: { type: 'string', maxLength: 200, description: 'The `next_cursor` of the previous page.' },
} as const;

export const listMessagesQuery = { type: 'object', properties: pageQuery } as const;

export const agentParams = {
  type: 'object',
  required: ['agent'],
  properties: { agent: { type: 'string', maxLength: 200 } },
} as const;

export const runParams = {
  type: 'object',
  required: ['id'],
  properties: { id: { type: 'string', maxLength: 500 } },
} as const;

/**
 * `POST /agents/runs/:id/resume`. The items are described rather than constrained here: the
 * route checks them against the run's pending calls and names a bad one as `answers[1].text`.
 */
export const resumeRunBody = {
  type: 'object',
  properties: {
    approvals: {
      description:
        "For a run whose `required_action.type` is `approve_tool_calls`: one `{ tool_call_id, approved, reason? }` for each of its `tool_calls` (`tool_call_id` is the call's `id`; `approved: false` gives the model a result saying it was declined; `reason`, at most 4,000 characters, goes with it).",
      type: 'array',
      items: { description: '`{ tool_call_id: string, approved: boolean, reason?: string }`' },
    },
    answers: {
      description:
        "For a run whose `required_action.type` is `answer_question`: `{ tool_call_id, text }` for some or all of its `questions`; `text` (non-blank, at most 32,000 characters) is the call's result. The run goes on once every question is answered, and until then waits on the rest.",
      type: 'array',
      items: { description: '`{ tool_call_id: string, text: string }`' },
    },
    wait: {
      description:
        'Hold the request until the run ends or pauses again (default: true for the default class).',
    },
  },
} as const;

export const listRunsQuery = {
  type: 'object',
  properties: {
    ...pageQuery,
    status: { type: 'string', maxLength: 200, description: 'Comma-separated statuses.' },
    class: { type: 'string', enum: ['default', 'deferred'] },
  },
} as const;

/** How each field with alternatives is described when it matches none of them (`*`: any key). */
export const expectations: Record<string, string> = {
  input: 'be a non-empty string or a non-empty list of messages `{ role, content }`',
  run_at: 'be an RFC 3339 time with an offset (e.g. 2030-01-01T09:00:00Z) or whole epoch seconds',
  content:
    'be a non-empty string or a non-empty list of `{ type: "text", text }` and `{ type: "input_image", file_id }` blocks',
  'metadata.*': 'be a string of at most 512 characters, a number, a boolean or null',
  limit: 'be a whole number from 1 to 1000 (larger values give 1000)',
};

/** What each pattern asks for, in words. */
export const patternMeanings: Record<string, string> = {
  [storableText]: 'hold no U+0000 character and no unpaired UTF-16 surrogate',
  [positiveInteger]: 'be a whole number from 1 to 1000 (larger values give 1000)',
};

export const runEventsQuery = {
  type: 'object',
  properties: {
    after: {
      type: 'string',
      maxLength: 20,
      description: 'Send the events after this id (as Last-Event-ID).',
    },
  },
} as const;

export const getRunQuery = {
  type: 'object',
  properties: {
    wait_ms: {
      type: 'string',
      pattern: '^[0-9]{1,10}$',
      description: 'Hold the answer until the run settles, at most this long (and AGENT_SYNC_TIMEOUT_MS).',
    },
  },
} as const;
