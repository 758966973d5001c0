import { Ajv, type ValidateFunction } from 'ajv';
import type { FastifyError, FastifyRequest } from 'fastify';
import { frameworkError } from '../http/error-handling.js';
import { HttpError, badRequest } from '../http/errors.js';
import { createRunBody } from '../http/schemas.js';
import type { OnBusy } from '../threads/hold.js';
import type { ClientConfig } from '../runs/run-config.js';

/** The client frames of `GET /ws`, checked as strictly as the HTTP bodies they mirror. */

type Message = { role: 'user' | 'assistant' | 'system'; content: string | { type: 'text'; text: string }[] };

export interface RunFrame {
  type: 'run';
  request_id: string;
  agent: string;
  input?: string | Message[];
  messages?: Message[];
  thread_id?: string;
  on_busy?: OnBusy;
  on_disconnect?: 'continue' | 'cancel';
  config?: ClientConfig;
}

export interface CancelFrame {
  type: 'cancel';
  run_id: string;
  request_id?: string;
}

const requestId = { type: 'string', minLength: 1, maxLength: 200 } as const;
const run = createRunBody.properties;

const runFrame = {
  type: 'object',
  additionalProperties: false,
  required: ['type', 'request_id', 'agent'],
  properties: {
    type: { const: 'run' },
    request_id: requestId,
    agent: { type: 'string', minLength: 1, maxLength: 64 },
    input: run.input,
    messages: run.messages,
    thread_id: run.thread_id,
    on_busy: run.on_busy,
    on_disconnect: run.on_disconnect,
    config: run.config,
  },
} as const;

const cancelFrame = {
  type: 'object',
  additionalProperties: false,
  required: ['type', 'run_id'],
  properties: {
    type: { const: 'cancel' },
    run_id: { type: 'string', minLength: 1, maxLength: 100 },
    request_id: requestId,
  },
} as const;

// The type first, then the schema of that frame type, so an error names the field of that frame.
const frameSchema = {
  type: 'object',
  required: ['type'],
  allOf: [
    { properties: { type: { type: 'string', enum: ['run', 'cancel'] } } },
    { if: { properties: { type: { const: 'run' } } }, then: runFrame },
    { if: { properties: { type: { const: 'cancel' } } }, then: cancelFrame },
  ],
} as const;

// The options of the server's own validator (app.ts): no coercion, no defaults, first error only.
export const frameAjv = new Ajv({
  removeAdditional: false,
  coerceTypes: false,
  useDefaults: false,
  allErrors: false,
});
const validate = frameAjv.compile(frameSchema);

/** Refuses `__proto__` keys and `constructor.prototype`, as the HTTP body parser does. */
function reviver(key: string, value: unknown): unknown {
  if (
    key === '__proto__' ||
    (key === 'constructor' &&
      value !== null &&
      typeof value === 'object' &&
      Object.hasOwn(value, 'prototype'))
  )
    throw new HttpError(
      400,
      'invalid_request',
      'The frame holds a `__proto__` key or a `constructor.prototype`; neither is accepted',
      {
        field: '__proto__',
      },
    );
  return value;
}

/** The request id of a frame that is refused before it could be read whole, when it has one. */
export function requestIdOf(frame: unknown): string | null {
  const id = (frame as { request_id?: unknown } | null)?.request_id;
  return typeof id === 'string' && id.length > 0 && id.length <= 200 ? id : null;
}

/** A frame's text as a client frame, or the 400 that says what is wrong with it. */
export function parseFrame(
  text: string,
): { frame: RunFrame | CancelFrame } | { error: HttpError; frame: unknown } {
  return parseJsonFrame<RunFrame | CancelFrame>(text, validate);
}

/** A frame's text checked against `validate` (compiled with {@link frameAjv}), or the 400 that says what is wrong. */
export function parseJsonFrame<T>(
  text: string,
  validate: ValidateFunction,
): { frame: T } | { error: HttpError; frame: unknown } {
  let frame: unknown;
  try {
    frame = JSON.parse(text, reviver);
  } catch (error) {
    if (error instanceof HttpError) return { error, frame: undefined };
    return {
      error: badRequest(`The frame is not valid JSON: ${(error as Error).message}`),
      frame: undefined,
    };
  }
  if (validate(frame)) return { frame: frame as T };
  // The same wording as a body that fails its schema: the field, the rule, the value.
  const failure = Object.assign(new Error('invalid frame'), {
    statusCode: 400,
    validation: (validate.errors ?? []).filter((e) => e.keyword !== 'if'),
    validationContext: 'body',
  }) as unknown as FastifyError;
  const error = frameworkError(failure, { body: frame } as unknown as FastifyRequest);
  return {
    error: new HttpError(
      error.status,
      error.type,
      error.message.replace(/\bthe body\b/, 'the frame'),
      error.details,
    ),
    frame,
  };
}
