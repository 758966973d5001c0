/** The body every error of the run server has: `{ error: { type, code, message, param, ... } }`. */
export interface ErrorBody {
  type?: string;
  code?: string;
  message?: string;
  param?: string | null;
  retry_after_ms?: number;
  [key: string]: unknown;
}

/** An answer of the run server that is not a success: its status and the fields of its error body. */
export class SluiceError extends Error {
  override readonly name: string = 'SluiceError';
  readonly status: number;
  readonly type: string;
  readonly code: string;
  /** The request field the error is about (`input`, `Last-Event-ID`...), or null. */
  readonly param: string | null;
  /** How long the server asks to wait before trying again (Retry-After), when it says. */
  readonly retryAfterMs: number | undefined;
  /** The whole `error` object, details included. */
  readonly error: ErrorBody;

  constructor(status: number, error: ErrorBody, retryAfterMs?: number, options?: { cause?: unknown }) {
    super(error.message ?? `The run server answered ${status}`, options);
    this.status = status;
    this.type = error.type ?? 'unknown';
    this.code = error.code ?? this.type;
    this.param = error.param ?? null;
    this.retryAfterMs = retryAfterMs;
    this.error = error;
  }
}

/** A 429: a cap, a quota or a limit refused the call; `retryAfterMs` says when to come back. */
export class RateLimitError extends SluiceError {
  override readonly name = 'RateLimitError';
}

/** How much of an error body is read: a proxy's page can be large, a hostile server's endless. */
const MAX_ERROR_BODY = 64 * 1024;
/** How much of a body that is not JSON goes into a message. */
const SNIPPET = 200;

/** The error of a response that is not 2xx, from its body and its Retry-After header. */
export async function errorOf(response: Response): Promise<SluiceError> {
  const text = await readCapped(response, MAX_ERROR_BODY).catch(() => '');
  let error: ErrorBody | undefined;
  try {
    const parsed = JSON.parse(text) as { error?: unknown } | null;
    if (parsed && typeof parsed.error === 'object' && parsed.error !== null)
      error = cleanError(parsed.error as ErrorBody);
  } catch {
    // Not JSON (a proxy's page): a piece of its text is the message.
  }
  error ??= { message: notJson(response, text) };
  const retryAfterMs = retryAfterOf(response.headers, error);
  return response.status === 429
    ? new RateLimitError(response.status, error, retryAfterMs)
    : new SluiceError(response.status, error, retryAfterMs);
}

/** The run server's error object with its named fields kept only when they have their types. */
function cleanError(error: ErrorBody): ErrorBody {
  const clean: ErrorBody = { ...error };
  for (const field of ['type', 'code', 'message'] as const)
    if (typeof clean[field] !== 'string') delete clean[field];
  if (clean.param !== undefined && clean.param !== null && typeof clean.param !== 'string')
    delete clean.param;
  if (!(
    typeof clean.retry_after_ms === 'number' &&
    clean.retry_after_ms >= 0 &&
    Number.isFinite(clean.retry_after_ms)
  ))
    delete clean.retry_after_ms;
  return clean;
}

/** A message for a body that is not the JSON the server sends: its status, type and first characters. */
export function notJson(response: Response, text: string): string {
  const type = response.headers.get('content-type') ?? 'no content-type';
  const snippet = text.replace(/\s+/g, ' ').trim();
  const shown = snippet.length > SNIPPET ? `${snippet.slice(0, SNIPPET)}...` : snippet;
  return `The run server answered ${response.status} (${type})${shown ? `: ${shown}` : ' with an empty body'}`;
}

/** The body as text, at most `limit` characters of it (the rest is not read). */
async function readCapped(response: Response, limit: number): Promise<string> {
  if (!response.body) return '';
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  try {
    while (text.length < limit) {
      const { done, value } = await reader.read();
      if (done) return text + decoder.decode();
      text += decoder.decode(value, { stream: true });
    }
    return text.slice(0, limit);
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** Retry-After as RFC 9110 writes it: whole seconds (a fraction taken too) or an HTTP date. */
const SECONDS = /^\d+(\.\d+)?$/;
const HTTP_DATE = /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? /i;

/**
 * Retry-After in milliseconds: the body's exact figure, else the header (seconds or a date);
 * undefined for anything else (a negative figure, garbage). Only a day-named date is read as
 * one: `Date.parse` reads "-5" or "soon 1" as days in 2001.
 */
function retryAfterOf(headers: Headers, error: ErrorBody): number | undefined {
  if (error.retry_after_ms !== undefined) return error.retry_after_ms;
  const header = headers.get('retry-after')?.trim();
  if (!header) return undefined;
  if (SECONDS.test(header)) return Math.round(Number(header) * 1000);
  if (!HTTP_DATE.test(header)) return undefined;
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}
