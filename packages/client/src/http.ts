import type { SluiceError } from './errors.js';
import { errorOf } from './errors.js';

export interface ClientOptions {
  /** The server's origin, e.g. `http://127.0.0.1:8787`. */
  baseUrl: string;
  /** An API token (`sluice tokens create`). */
  token: string;
  /**
   * How many times a 429 or 503 is tried again, after its Retry-After (or a backoff from
   * 0.5 s, doubling); 0 turns retries off. @default 2
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

/** Requests to the run server: auth, JSON, errors as `SluiceError`, retries of 429 and 503. */
export class Transport {
  readonly #base: string;
  readonly #token: string;
  readonly #maxRetries: number;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    if (typeof options.baseUrl !== 'string' || !/^https?:\/\//.test(options.baseUrl))
      throw new TypeError(`Expected \`baseUrl\` to be an http(s) URL, got \`${String(options.baseUrl)}\``);
    const retries = options.maxRetries ?? 2;
    if (!Number.isInteger(retries) || retries < 0)
      throw new TypeError(
        `Expected \`maxRetries\` to be a whole number >= 0, got \`${String(options.maxRetries)}\``,
      );
    this.#base = options.baseUrl.replace(/\/+$/, '');
    this.#token = options.token;
    this.#maxRetries = retries;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** A JSON call; resolves with the parsed body of a 2xx answer. */
  async json<T>(method: string, path: string, body: unknown, options: CallOptions = {}): Promise<T> {
    const response = await this.send(method, path, body, options);
    return (await response.json()) as T;
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
      await sleep(error.retryAfterMs ?? 500 * 2 ** attempt, options.signal);
    }
  }
}

const retryable = (error: SluiceError) => error.status === 429 || error.status === 503;

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
