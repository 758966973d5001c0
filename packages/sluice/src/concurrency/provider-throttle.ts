import type { ProviderFeedback, RateLimitWindow } from './capacity-types.js';

/** The statuses with which a provider says its account (or the service) is overloaded. */
const overloaded = new Set([429, 503, 529]);

/** When no wait is named, a pause lasts this long. */
export const defaultThrottleMs = 1_000;

/**
 * Whether a provider's answer says to stop sending for a while, and for how long: a 429, 503
 * or 529, or a window with nothing remaining. The wait is the one the provider named
 * (`retryAfterMs`, or `retry-after` in its headers), else the longest reset among the
 * exhausted windows, else 1 s. Undefined when the provider did not say to wait.
 */
export function providerThrottle(
  feedback: ProviderFeedback,
): { status: number | undefined; retryAfterMs: number } | undefined {
  const { status, limits } = feedback;
  const windows = [limits?.requests, limits?.tokens, limits?.inputTokens, limits?.outputTokens].filter(
    (w): w is RateLimitWindow => w !== undefined && w.remaining === 0,
  );
  if (!(status !== undefined && overloaded.has(status)) && windows.length === 0) return undefined;
  const named = validWait(feedback.retryAfterMs) ?? validWait(limits?.retryAfterMs);
  const resets = windows.map((w) => validWait(w.resetMs)).filter((ms): ms is number => ms !== undefined);
  const retryAfterMs = named ?? (resets.length > 0 ? Math.max(...resets) : defaultThrottleMs);
  return { status, retryAfterMs };
}

function validWait(ms: number | undefined): number | undefined {
  return typeof ms === 'number' && Number.isFinite(ms) && ms >= 0 ? ms : undefined;
}
