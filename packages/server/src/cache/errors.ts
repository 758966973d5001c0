/**
 * The cache store (Redis) did not answer: the caps it keeps cannot be checked, so nothing is
 * admitted unchecked. The HTTP layer answers 503 with this wait as Retry-After.
 */
export class CacheUnavailableError extends Error {
  readonly code = 'cache_unavailable';
  readonly retryAfterMs = 5_000;

  constructor(cause?: unknown) {
    super('The server cannot reach its cache store (Redis); try again shortly', { cause });
    this.name = 'CacheUnavailableError';
  }
}
