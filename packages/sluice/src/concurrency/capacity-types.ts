/**
 * The types of provider capacity (DESIGN.md, part 3): token and request budgets, what a
 * release reports back, and the provider's own rate-limit figures. Behaviour lives in the
 * limiter and in `allocate`; this file only names the shapes every limiter shares.
 */

/** Tokens a request is expected to use (at acquire) or did use (at release). */
export interface TokenCounts {
  readonly input?: number | undefined;
  readonly output?: number | undefined;
}

/** Per-minute budgets of a limiter; each is optional. A budget is a token bucket. */
export interface RateOptions {
  /** Requests granted per minute. */
  requestsPerMinute?: number;
  /** Input plus output tokens per minute. */
  tokensPerMinute?: number;
  inputTokensPerMinute?: number;
  outputTokensPerMinute?: number;
}

/** The names of the budgets, as `stats().budgets` and errors name them. */
export type BudgetName = 'requests' | 'tokens' | 'inputTokens' | 'outputTokens';

/** One budget's state: what a grant could take now, and the per-minute figure. */
export interface BudgetStats {
  readonly available: number;
  readonly capacity: number;
}

export type BudgetsStats = { readonly [K in BudgetName]?: BudgetStats };

/** Settings of the adaptive concurrency limit (`adaptive: true` takes every default). */
export interface AdaptiveOptions {
  /**
   * The effective limit never goes below this.
   * @default the sum of the reservations, plus 1 when some workload has none, at least 1
   */
  minConcurrent?: number;
}

/** One window of a provider's rate limit, as its headers give it. */
export interface RateLimitWindow {
  readonly limit?: number | undefined;
  readonly remaining?: number | undefined;
  /** Time until the window resets, in ms from now. */
  readonly resetMs?: number | undefined;
}

/** What `rateLimitsFromHeaders` reads from a provider response. */
export interface ProviderRateLimits {
  readonly requests?: RateLimitWindow | undefined;
  readonly tokens?: RateLimitWindow | undefined;
  readonly inputTokens?: RateLimitWindow | undefined;
  readonly outputTokens?: RateLimitWindow | undefined;
  /** From `retry-after-ms`, else `retry-after` (seconds or an HTTP date), in ms from now. */
  readonly retryAfterMs?: number | undefined;
}

/** What the provider said about a request. */
export interface ProviderFeedback {
  /** HTTP status of the provider's answer; 429, 503 and 529 pause the limiter. */
  readonly status?: number | undefined;
  readonly retryAfterMs?: number | undefined;
  readonly limits?: ProviderRateLimits | undefined;
}

/** The optional second argument of `release`: how the request went. */
export interface ReleaseDetails {
  /** Tokens the request really used; the grant is settled to them. */
  readonly usage?: TokenCounts | undefined;
  readonly provider?: ProviderFeedback | undefined;
}
