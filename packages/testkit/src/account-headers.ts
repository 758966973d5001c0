import type { ProviderAccount, Refusal, WindowFigures } from './account.js';

type Protocol = 'openai' | 'anthropic';

/**
 * The rate-limit headers of a response, as the protocol's provider sends them: OpenAI's
 * `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` with resets as Go durations, or
 * Anthropic's `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}` with resets as
 * RFC 3339 times. A refusal adds `retry-after` (whole seconds, rounded up) and
 * `retry-after-ms`.
 */
export function accountHeaders(
  protocol: Protocol,
  account: ProviderAccount,
  refusal?: Refusal,
): Record<string, string> {
  const { now, ...windows } = account.windows();
  const headers: Record<string, string> = {};
  for (const [name, figures] of Object.entries(windows) as [string, WindowFigures][]) {
    if (protocol === 'openai') {
      headers[`x-ratelimit-limit-${name}`] = String(figures.limit);
      headers[`x-ratelimit-remaining-${name}`] = String(figures.remaining);
      headers[`x-ratelimit-reset-${name}`] = goDuration(figures.resetMs);
    } else {
      headers[`anthropic-ratelimit-${name}-limit`] = String(figures.limit);
      headers[`anthropic-ratelimit-${name}-remaining`] = String(figures.remaining);
      headers[`anthropic-ratelimit-${name}-reset`] = new Date(now + figures.resetMs).toISOString();
    }
  }
  if (refusal?.retryAfterMs !== undefined) {
    headers['retry-after'] = String(Math.ceil(refusal.retryAfterMs / 1_000));
    headers['retry-after-ms'] = String(refusal.retryAfterMs);
  }
  return headers;
}

/** The error body of a refusal, in the protocol's shape. */
export function refusalBody(protocol: Protocol, refusal: Refusal): unknown {
  if (protocol === 'anthropic')
    return { type: 'error', error: { type: 'rate_limit_error', message: refusal.message } };
  return {
    error: {
      message: refusal.message,
      type: refusal.limit === 'tokens' ? 'tokens' : 'requests',
      param: null,
      code: 'rate_limit_exceeded',
    },
  };
}

/** Whole ms as Go prints a duration: `12ms`, `1.5s`, `6m0s`, `1h2m3.5s`, `0s`. */
export function goDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1_000) return `${ms}ms`;
  const hours = Math.floor(ms / 3_600_000);
  const minutes = Math.floor((ms % 3_600_000) / 60_000);
  const seconds = `${(ms % 60_000) / 1_000}s`;
  if (hours > 0) return `${hours}h${minutes}m${seconds}`;
  if (minutes > 0) return `${minutes}m${seconds}`;
  return seconds;
}
