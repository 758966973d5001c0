/**
 * Budgets learned from the provider (DESIGN.md part 3, with `adaptive`). Every answer of
 * OpenAI and Anthropic states the account's per-minute limits in its rate-limit headers; an
 * adaptive limiter is there for accounts whose limits nobody told it, so it takes each stated
 * figure as a budget, a token bucket exactly like a configured `rate` figure: the same
 * `allocate` rule, the same settling, the same lowering to the provider's `remaining`.
 *
 * - A configured figure always wins over a learned one of the same budget: the operator may
 *   know better (a share of the account, a limit the headers do not state).
 * - The figure is the one the latest answer stated: an account's tier changes, and the
 *   provider is the authority on it. A lower figure takes effect at once (the bucket's level
 *   is capped to it); a higher one refills faster from then on but adds no tokens now.
 * - A window whose reset is more than a minute away is not a per-minute window (OpenAI
 *   states requests per day on some tiers this way): it is not learned.
 * - Garbage (not a number, not finite, below 1, above `Number.MAX_SAFE_INTEGER`) is ignored,
 *   figure by figure: feedback never throws, and one broken header keeps the figure before it.
 * - A request larger than a learned figure is not refused (the `ConcurrencyConfigError` of
 *   a request larger than a whole budget is for configured budgets): it goes once the bucket
 *   is full (see `waitToFit`'s `oversize`). A learned figure is one header's word and may be
 *   stale or another key's; waiting for a bucket that can never hold the request would end
 *   in a timeout that blames the limiter, while the provider, the only one that knows, can
 *   serve it (a raised tier) or refuse it itself. A full bucket is all the protection the
 *   limiter can give: the request takes a minute's refill, and the debt stays bounded.
 *
 * Only the figures are kept: the latest `remaining` becomes the bucket's level (the lowering
 * rule in capacity.ts) and the reset follows from the level and the figure, so keeping them
 * apart would be a second copy of the same fact that could disagree with the first.
 *
 * A new bucket starts at the `remaining` of the answer that stated it, and grants made before
 * it existed are settled into it like any other. That remaining already counts, at their
 * estimates, the requests the provider had admitted (providers charge a request's output cap
 * when they admit it and give the unused part back at its end, as the stand-in does), so their
 * refunds are owed to the bucket; leaving them out kept the bucket a few thousand tokens below
 * the provider's for good (lowering to `remaining` only lowers). A request granted before the
 * bucket and admitted after that answer is refunded without its charge having been taken: the
 * error is at most its estimate, once, and the next answer's `remaining` corrects it.
 */
import { BUDGET_NAMES, type BudgetFigures } from './budgets.js';
import type { BudgetName, ProviderRateLimits, RateLimitWindow } from './capacity-types.js';
import { MINUTE, SECOND } from './clock.js';

/** A budget the provider stated. */
export interface LearnedBudget {
  /** The provider's per-minute figure, as its latest answer stated it. */
  readonly limit: number;
}

export type LearnedBudgets = { readonly [K in BudgetName]?: LearnedBudget };

/**
 * The longest reset of a per-minute window, with a second of slack: Anthropic's resets are
 * RFC 3339 times of whole seconds, so a full minute can read a little over 60 s.
 */
const MAX_MINUTE_RESET_MS = MINUTE + SECOND;

const NO_FIGURES: BudgetFigures = Object.freeze({});

/** A stated limit that can be a per-minute figure, else `undefined`. */
function statedLimit(window: RateLimitWindow | undefined | null): number | undefined {
  if (typeof window !== 'object' || window === null) return undefined;
  const { limit, resetMs } = window;
  if (typeof limit !== 'number' || !Number.isFinite(limit)) return undefined;
  if (limit < 1 || limit > Number.MAX_SAFE_INTEGER) return undefined;
  if (typeof resetMs === 'number' && resetMs > MAX_MINUTE_RESET_MS) return undefined;
  return limit;
}

/**
 * The learned budgets after an answer's rate-limit figures. Returns `learned` itself when
 * nothing changed, so callers can tell by identity.
 *
 * @example
 * learn(undefined, { tokens: { limit: 60_000, remaining: 41_000, resetMs: 19_000 } })
 * // => { tokens: { limit: 60_000 } }
 */
export function learn(
  learned: LearnedBudgets | undefined,
  limits: ProviderRateLimits | undefined | null,
): LearnedBudgets | undefined {
  if (typeof limits !== 'object' || limits === null) return learned;
  let next: Partial<Record<BudgetName, LearnedBudget>> | undefined;
  for (const name of BUDGET_NAMES) {
    const limit = statedLimit(limits[name]);
    const known = learned?.[name];
    if (limit === undefined || limit === known?.limit) continue;
    next ??= { ...learned };
    next[name] = { limit };
  }
  return next ?? learned;
}

/** The figures of every budget in force: the configured ones, and the learned ones they leave. */
export function budgetFigures(
  rate: BudgetFigures | undefined,
  learned: LearnedBudgets | undefined,
): BudgetFigures {
  if (learned === undefined) return rate ?? NO_FIGURES;
  const out: Partial<Record<BudgetName, number>> = {};
  for (const name of BUDGET_NAMES) {
    const figure = rate?.[name] ?? learned[name]?.limit;
    if (figure !== undefined) out[name] = figure;
  }
  return out;
}

/** The budgets in force only by learning (no configured figure): a larger request may go when full. */
export function learnedOnly(
  rate: BudgetFigures | undefined,
  learned: LearnedBudgets | undefined,
): ReadonlySet<BudgetName> | undefined {
  if (learned === undefined) return undefined;
  const names = BUDGET_NAMES.filter((name) => learned[name] !== undefined && rate?.[name] === undefined);
  return names.length === 0 ? undefined : new Set(names);
}

/**
 * The learned budgets of a stored state (the PostgreSQL limiter's row), field by field:
 * anything that is not a well-formed figure is dropped, so a damaged or old row still loads.
 */
export function parseLearned(raw: unknown): LearnedBudgets | undefined {
  if (typeof raw !== 'object' || raw === null) return undefined;
  const out: Partial<Record<BudgetName, LearnedBudget>> = {};
  let any = false;
  for (const name of BUDGET_NAMES) {
    const entry: unknown = Object.hasOwn(raw, name) ? (raw as Record<string, unknown>)[name] : undefined;
    if (typeof entry !== 'object' || entry === null) continue;
    const figure = statedLimit({ limit: (entry as { limit?: unknown }).limit as number });
    if (figure === undefined) continue;
    out[name] = { limit: figure };
    any = true;
  }
  return any ? out : undefined;
}
