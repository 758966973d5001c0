import { SluiceError, errorOf, notJson } from './errors.js';

export interface ClientOptions {
  /** The server's origin, e.g. `http://127.0.0.1:8787`. */
  baseUrl: string;
  /** An API token (`sluice tokens create`). */
  token: string;
  /**
   * How many times a 429 or 503 is tried again, after its Retry-After (or a backoff from
   * 0.5 s, doubling); 0 turns retries off. A Retry-After over a minute is not waited for: the
   * error is thrown at once, with its `retryAfterMs`. @default 2
   */
  maxRetries?: number;
  /** The fetch to use. @default globalThis.fetch */
  fetch?: typeof fetch;
}

/** What every call takes. */
export interface CallOptions {
  signal?: AbortSignal;
}

const API = '/api/client/v1';
/** The longest Retry-After a call sleeps on before trying again; past it, the error is the caller's. */
export const MAX_RETRY_WAIT_MS = 60_000;
/** A bearer token: visible ASCII, no space or control character (a CR LF would split the header). */
const TOKEN = /^[\x21-\x7e]+$/;

/** Requests to the run server: auth, JSON, errors as `SluiceError`, retries of 429 and 503. */
export class Transport {
  readonly #base: string;
  readonly #token: string;
  readonly #maxRetries: number;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    const base = urlOf(options.baseUrl);
    if (
      !base ||
      !['http:', 'https:'].includes(base.protocol) ||
      base.search ||
      base.hash ||
      base.username ||
      base.password
    )
      throw new TypeError(
        `Expected \`baseUrl\` to be an http(s) URL without a query, a fragment or credentials (the server's origin), got \`${String(options.baseUrl)}\``,
      );
    // The token is never shown: it is a secret.
    if (typeof options.token !== 'string' || !TOKEN.test(options.token))
      throw new TypeError(
        typeof options.token === 'string' && options.token !== ''
          ? 'Expected `token` to be an API token: it has a space or a control character (CR or LF would split the Authorization header)'
          : `Expected \`token\` to be an API token (a non-empty string), got ${options.token === '' ? 'an empty string' : typeof options.token}`,
      );
    const retries = options.maxRetries ?? 2;
    if (!Number.isInteger(retries) || retries < 0)
      throw new TypeError(
        `Expected \`maxRetries\` to be a whole number >= 0, got \`${String(options.maxRetries)}\``,
      );
    this.#base = `${base.origin}${base.pathname.replace(/\/+$/, '')}`;
    this.#token = options.token;
    this.#maxRetries = retries;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** A JSON call; resolves with the parsed body of a 2xx answer (a body that is not JSON is a SluiceError). */
  async json<T>(method: string, path: string, body: unknown, options: CallOptions = {}): Promise<T> {
    const response = await this.send(method, path, body, options);
    const text = await response.text();
    try {
      return JSON.parse(text) as T;
    } catch (error) {
      throw new SluiceError(
        response.status,
        { type: 'invalid_response', message: notJson(response, text) },
        undefined,
        {
          cause: error,
        },
      );
    }
  }

  /** A call whose 2xx response is returned unread (a stream). */
  async send(
    method: string,
    path: string,
    body: unknown,
    options: CallOptions & { headers?: Record<string, string> } = {},
  ): Promise<Response> {
    for (let attempt = 0; ; attempt++) {
      options.signal?.throwIfAborted();
      const response = await this.#fetch(`${this.#base}${API}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${this.#token}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
          ...options.headers,
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: options.signal,
      });
      if (response.ok) return response;
      const error = await errorOf(response);
      if (!retryable(error) || attempt >= this.#maxRetries) throw error;
      if (error.retryAfterMs !== undefined && error.retryAfterMs > MAX_RETRY_WAIT_MS) throw error;
      await sleep(error.retryAfterMs ?? 500 * 2 ** attempt, options.signal);
    }
  }
}

const retryable = (error: SluiceError) => error.status === 429 || error.status === 503;

function urlOf(value: unknown): URL | undefined {
  try {
    return typeof value === 'string' ? new URL(value) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * One path segment from a caller's id or name, encoded; an empty one, `.` or `..` is refused
 * (a URL would resolve it to another route: `runs.get('')` would list runs).
 */
export function segment(name: string, value: unknown): string {
  if (typeof value !== 'string' || value === '' || value === '.' || value === '..')
    throw new TypeError(
      `Expected \`${name}\` to be a non-empty string other than "." and "..", got ${value === undefined ? 'undefined' : JSON.stringify(value)}`,
    );
  return encodeURIComponent(value);
}

/** Waits `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
