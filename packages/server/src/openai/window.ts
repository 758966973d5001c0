/** How long the official OpenAI clients wait for an answer unless told otherwise (their default timeout). */
const OPENAI_CLIENT_TIMEOUT_MS = 600_000;

/**
 * How long to hold a caller that says how long it will wait: a little less than that, so it
 * gets its 202 before it gives up and retries (which would start the same work again), and
 * never more than the sync window. The official OpenAI clients send `X-Stainless-Timeout`
 * (seconds) when a request has its own timeout, and otherwise wait their default 10 minutes,
 * as long as the default sync window: without this they would always give up first.
 */
export function windowFor(
  headers: Record<string, string | string[] | undefined>,
  syncTimeoutMs: number,
): number {
  const raw = headers['x-stainless-timeout'];
  const seconds = typeof raw === 'string' ? Number(raw) : Number.NaN;
  const clientMs =
    Number.isFinite(seconds) && seconds > 0
      ? seconds * 1000
      : headers['x-stainless-lang'] !== undefined
        ? OPENAI_CLIENT_TIMEOUT_MS
        : undefined;
  if (clientMs === undefined) return syncTimeoutMs;
  return Math.max(100, Math.min(syncTimeoutMs, clientMs - Math.max(1_000, clientMs / 20)));
}
