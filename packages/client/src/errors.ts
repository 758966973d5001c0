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

  constructor(status: number, error: ErrorBody, retryAfterMs?: number) {
    super(error.message ?? `The run server answered ${status}`);
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

/** The error of a response that is not 2xx, from its body and its Retry-After header. */
export async function errorOf(response: Response): Promise<SluiceError> {
  const text = await response.text().catch(() => '');
  let error: ErrorBody = { message: text || `The run server answered ${response.status}` };
  try {
    const parsed = JSON.parse(text) as { error?: ErrorBody };
    if (parsed && typeof parsed.error === 'object' && parsed.error !== null) error = parsed.error;
  } catch {
    // Not JSON (a proxy's page): its text is the message.
  }
  const retryAfterMs = retryAfterOf(response.headers, error);
  return response.status === 429
    ? new RateLimitError(response.status, error, retryAfterMs)
    : new SluiceError(response.status, error, retryAfterMs);
}

/** Retry-After in milliseconds: the body's exact figure, else the header (seconds or a date). */
function retryAfterOf(headers: Headers, error: ErrorBody): number | undefined {
  if (typeof error.retry_after_ms === 'number') return error.retry_after_ms;
  const header = headers.get('retry-after');
  if (header === null) return undefined;
  if (/^\d+$/.test(header.trim())) return Number(header) * 1000;
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}
