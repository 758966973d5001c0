/**
 * A provider's rate-limit figures as they stand some time after they were read. The headers
 * come with the response's start, the release with its end, which for a streamed answer can
 * be minutes later: a `remaining: 0` whose window has reset since, told as news, lowered the
 * bucket to 0 and paused every grant for the whole reset again, measured from the release.
 */
import { BUDGET_NAMES } from './budgets.js';
import type { ProviderRateLimits, RateLimitWindow } from './capacity-types.js';

/**
 * `limits` read `elapsedMs` ago, as of now: each reset and `retryAfterMs` shortened by the
 * time gone (never below 0), and a window whose reset has passed keeps only its `limit` (its
 * `remaining` counted a window that is over). A `remaining` whose window is still running is
 * kept as it was: the provider's own refill since is unknown, and lower is the safe side.
 *
 * @example
 * agedRateLimits({ tokens: { limit: 60_000, remaining: 0, resetMs: 30_000 } }, 45_000)
 * // => { tokens: { limit: 60_000 } }
 */
export function agedRateLimits(limits: ProviderRateLimits, elapsedMs: number): ProviderRateLimits {
  if (!(elapsedMs > 0) || !Number.isFinite(elapsedMs)) return limits;
  const out: { -readonly [K in keyof ProviderRateLimits]: ProviderRateLimits[K] } = {};
  for (const name of BUDGET_NAMES) {
    const window = limits[name] === undefined ? undefined : agedWindow(limits[name], elapsedMs);
    if (window !== undefined) out[name] = window;
  }
  if (limits.retryAfterMs !== undefined) out.retryAfterMs = Math.max(0, limits.retryAfterMs - elapsedMs);
  return out;
}

function agedWindow(window: RateLimitWindow, elapsedMs: number): RateLimitWindow | undefined {
  if (window.resetMs === undefined) return window;
  if (window.resetMs > elapsedMs) return { ...window, resetMs: window.resetMs - elapsedMs };
  return window.limit === undefined ? undefined : { limit: window.limit };
}
