import { hasUnsafeText } from '../runs/json.js';
import { HttpError, badRequest } from './errors.js';

/** The fixed request limits (bounded-runs): past each, 413 `request_too_large` naming the limit. */
export const requestLimits = Object.freeze({
  bodyBytes: 10 * 1024 * 1024,
  messages: 500,
  contentBlocks: 100,
  textChars: 1_000_000,
});

type Message = { role: string; content: string | { type: string; text: string }[] };

const tooLarge = (
  limit: 'messages' | 'content_blocks' | 'text_chars',
  value: number,
  max: number,
  field: string,
) =>
  new HttpError(
    413,
    'request_too_large',
    `The request has ${value} ${limit.replace('_', ' ')}; the limit is ${max}`,
    { limit, limit_value: max, value, field },
  );

/**
 * Counts a run's input against the limits: messages, content blocks per message, and characters
 * of text in all. Text that jsonb cannot hold (U+0000, an unpaired surrogate) is refused too.
 */
export function checkInput(input: string | Message[], field = 'input'): void {
  if (typeof input === 'string') {
    if (input.length > requestLimits.textChars)
      throw tooLarge('text_chars', input.length, requestLimits.textChars, field);
    checkText(input, field);
    return;
  }
  if (input.length > requestLimits.messages)
    throw tooLarge('messages', input.length, requestLimits.messages, field);
  let chars = 0;
  input.forEach((message, i) => {
    const where = `${field}.${i}.content`;
    if (typeof message.content === 'string') {
      chars += message.content.length;
      checkText(message.content, where);
    } else {
      if (message.content.length > requestLimits.contentBlocks) {
        throw tooLarge('content_blocks', message.content.length, requestLimits.contentBlocks, where);
      }
      for (const block of message.content) {
        chars += block.text.length;
        checkText(block.text, where);
      }
    }
  });
  if (chars > requestLimits.textChars) throw tooLarge('text_chars', chars, requestLimits.textChars, field);
}

/** Refuses text with U+0000 or an unpaired surrogate (jsonb cannot store them). */
export function checkText(text: string, field: string): void {
  if (hasUnsafeText(text)) {
    throw badRequest(`Expected \`${field}\` to hold no U+0000 character and no unpaired UTF-16 surrogate`, {
      field,
    });
  }
}

/** Checks every key and string value of a flat object (metadata). */
export function checkFlatObject(value: Record<string, unknown>, field: string): void {
  for (const [key, inner] of Object.entries(value)) {
    checkText(key, field);
    if (typeof inner === 'string') checkText(inner, `${field}.${key}`);
  }
}
