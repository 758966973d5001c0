import { HttpError } from './errors.js';

/** The fixed request limits (bounded-runs): past each, 413 `request_too_large` naming the limit. */
export const requestLimits = Object.freeze({
  bodyBytes: 10 * 1024 * 1024,
  messages: 500,
  contentBlocks: 100,
  textChars: 1_000_000,
});

type Message = { role: string; content: string | { type: string; text?: string }[] };

const what = {
  messages: 'messages; the limit is',
  content_blocks: 'content blocks; the limit per message is',
  text_chars: 'characters of text in all; the limit is',
} as const;

const tooLarge = (limit: keyof typeof what, value: number, max: number, field: string) =>
  new HttpError(413, 'request_too_large', `\`${field}\` has ${value} ${what[limit]} ${max}`, {
    limit,
    limit_value: max,
    value,
    field,
  });

/**
 * Counts a run's input against the limits: messages, content blocks per message, and characters
 * of text in all. Everything else about the input (its shape, text jsonb can store) is the
 * schema's (http/schemas.ts); these counts are here because past them the answer is 413.
 */
export function checkInput(input: string | Message[], field = 'input'): void {
  if (typeof input === 'string') {
    if (input.length > requestLimits.textChars)
      throw tooLarge('text_chars', input.length, requestLimits.textChars, field);
    return;
  }
  if (input.length > requestLimits.messages)
    throw tooLarge('messages', input.length, requestLimits.messages, field);
  let chars = 0;
  input.forEach((message, i) => {
    const where = `${field}.${i}.content`;
    if (typeof message.content === 'string') {
      chars += message.content.length;
    } else {
      if (message.content.length > requestLimits.contentBlocks) {
        throw tooLarge('content_blocks', message.content.length, requestLimits.contentBlocks, where);
      }
      // Images are not text: their bytes are bounded by the body limit or by MEDIA_MAX_SIZE_MB.
      for (const block of message.content) chars += block.text?.length ?? 0;
    }
  });
  if (chars > requestLimits.textChars) throw tooLarge('text_chars', chars, requestLimits.textChars, field);
}
