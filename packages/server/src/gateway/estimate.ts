import type { TokenCounts } from 'sluice';

/**
 * The tokens a request is expected to use, from its body, for the limiter's token budgets.
 * Input: the characters of what the model reads (messages, system prompt, input,
 * instructions, tools), at 4 characters a token as the agent runtime counts prose; output: the
 * request's own cap (`max_tokens`, `max_completion_tokens`, `max_output_tokens`), else 0.
 * The limiter settles the grant to the usage the response reports, so close is enough.
 */
const CHARS_PER_TOKEN = 4;
const INPUT_FIELDS = ['messages', 'system', 'input', 'instructions', 'tools', 'prompt'] as const;
const OUTPUT_FIELDS = ['max_tokens', 'max_completion_tokens', 'max_output_tokens'] as const;

/** Characters of text in a JSON value: strings counted whole, other values by their JSON. */
function textLength(value: unknown): number {
  if (typeof value === 'string') return value.length;
  if (value === null || value === undefined) return 0;
  if (Array.isArray(value)) {
    let n = 0;
    for (const item of value) n += textLength(item);
    return n;
  }
  if (typeof value === 'object') {
    let n = 0;
    for (const key in value) n += key.length + textLength((value as Record<string, unknown>)[key]);
    return n;
  }
  return String(value).length;
}

export function estimateTokens(body: unknown): TokenCounts {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return { input: 0, output: 0 };
  const fields = body as Record<string, unknown>;
  let chars = 0;
  for (const field of INPUT_FIELDS) if (Object.hasOwn(fields, field)) chars += textLength(fields[field]);
  let output = 0;
  for (const field of OUTPUT_FIELDS) {
    const cap = fields[field];
    if (Object.hasOwn(fields, field) && typeof cap === 'number' && Number.isSafeInteger(cap) && cap > 0) {
      output = cap;
      break;
    }
  }
  return { input: Math.ceil(chars / CHARS_PER_TOKEN), output };
}

/** The body as JSON, or undefined when it is not (the upstream judges it; the estimate is 0). */
export function parseBody(body: Buffer | undefined): unknown {
  if (body === undefined || body.length === 0) return undefined;
  try {
    return JSON.parse(body.toString('utf8'));
  } catch {
    return undefined;
  }
}
