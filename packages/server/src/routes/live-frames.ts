import { badRequest, type HttpError } from '../http/errors.js';
import { storableText } from '../http/schemas.js';
import { frameAjv, parseJsonFrame } from './ws-frames.js';

/**
 * The client frames of `GET /live`: one kind, a turn's input. `on_busy: 'cancel'` stops the
 * turn in progress and runs this one after it; without it, an input during a turn is refused.
 */
export interface InputFrame {
  type: 'input';
  text: string;
  on_busy?: 'reject' | 'cancel';
}

/** The largest frame a live session reads; a longer one closes the socket with 1009. */
export const LIVE_MAX_FRAME_BYTES = 1024 * 1024;

const inputFrame = {
  type: 'object',
  additionalProperties: false,
  required: ['type', 'text'],
  properties: {
    type: { type: 'string', enum: ['input'] },
    text: { type: 'string', minLength: 1, pattern: storableText },
    on_busy: { type: 'string', enum: ['reject', 'cancel'] },
  },
} as const;

const validate = frameAjv.compile(inputFrame);

/** A frame's text as an input frame, or the 400 that names what is wrong with it. */
export function parseInputFrame(text: string): { frame: InputFrame } | { error: HttpError; frame: unknown } {
  const parsed = parseJsonFrame<InputFrame>(text, validate);
  // White space alone asks nothing: refused like an empty text.
  if ('frame' in parsed && !('error' in parsed) && parsed.frame.text.trim() === '') {
    return {
      error: badRequest('Expected `text` to hold more than white space', { field: 'text' }),
      frame: parsed.frame,
    };
  }
  return parsed;
}
