/**
 * Budgets as token buckets (DESIGN.md, part 3): the arithmetic, pure, shared by `allocate`,
 * settling and provider feedback, so every limiter counts the same way.
 *
 * A bucket holds at most its per-minute figure, starts full and refills continuously at
 * figure / 60,000 per millisecond. A grant takes its cost from every budget at once: 1 from
 * `requests`, `input + output` from `tokens`, `input` from `inputTokens`, `output` from
 * `outputTokens`. A level may go below zero (a request used more than its estimate): that debt
 * is paid by the refill before anyone else is granted.
 */
import type { BudgetName, BudgetsStats } from './capacity-types.js';

/** Per-minute figures of the configured budgets, by budget name. */
export type BudgetFigures = { readonly [K in BudgetName]?: number };

/** A bucket's level at a moment of the limiter's clock. */
export interface BucketLevel {
  readonly level: number;
  /** When `level` was read, in ms of the limiter's clock (the database's for PostgreSQL). */
  readonly at: number;
}

/** The levels of the budgets; a configured budget with no entry is full. */
export type BucketLevels = { readonly [K in BudgetName]?: BucketLevel };

/** A request's tokens after validation: both parts present, finite, >= 0. */
export interface TokenCost {
  readonly input: number;
  readonly output: number;
}

export const NO_TOKENS: TokenCost = Object.freeze({ input: 0, output: 0 });

export const BUDGET_NAMES: readonly BudgetName[] = ['requests', 'tokens', 'inputTokens', 'outputTokens'];

/** The option that sets each budget, for messages. */
export const BUDGET_OPTIONS: { readonly [K in BudgetName]: string } = {
  requests: 'rate.requestsPerMinute',
  tokens: 'rate.tokensPerMinute',
  inputTokens: 'rate.inputTokensPerMinute',
  outputTokens: 'rate.outputTokensPerMinute',
};

/**
 * The deepest a bucket may go into debt: one whole figure, a minute of refill. A usage far
 * above its estimate (or a garbage one) then delays the next grants by a minute at most; the
 * provider's own window has moved on by then too.
 */
const MAX_DEBT_FIGURES = 1;

/**
 * Slack on "fits", in tokens. Refill times are rounded up to whole milliseconds, yet the
 * refilled level can land a rounding error short of the cost; without this a timer set for
 * the exact moment would find the head a hair short and wait one more millisecond.
 */
const FIT_EPSILON = 1e-6;

const MS_PER_MINUTE = 60_000;

/** What a request takes from budget `name`. */
export function costIn(name: BudgetName, tokens: TokenCost): number {
  switch (name) {
    case 'requests':
      return 1;
    case 'tokens':
      return tokens.input + tokens.output;
    case 'inputTokens':
      return tokens.input;
    case 'outputTokens':
      return tokens.output;
    default: {
      const unknown: never = name;
      throw new Error(`unknown budget ${String(unknown)}`);
    }
  }
}

/** The configured budgets, in a fixed order. */
export function budgetsOf(figures: BudgetFigures): BudgetName[] {
  return BUDGET_NAMES.filter((name) => figures[name] !== undefined);
}

/**
 * The level of a bucket at `now`. A clock that went backwards (`now` before `at`) refills
 * nothing for the step; {@link refill} and {@link adjust} then restart the refill from the
 * new `now`. So a step back never grants a refill twice, and never freezes the budgets
 * until the clock catches up with the old time either (a step of an hour would stop every
 * grant for an hour).
 */
export function levelAt(figure: number, bucket: BucketLevel | undefined, now: number): number {
  if (bucket === undefined) return figure;
  const elapsed = Math.max(0, now - bucket.at);
  return Math.min(figure, bucket.level + (elapsed * figure) / MS_PER_MINUTE);
}

/** Every configured bucket brought to `now` (its refill added, `at` moved to `now`). */
export function refill(figures: BudgetFigures, levels: BucketLevels, now: number): BucketLevels {
  const out: Partial<Record<BudgetName, BucketLevel>> = {};
  for (const name of budgetsOf(figures)) {
    const bucket = levels[name];
    out[name] = { level: levelAt(figures[name]!, bucket, now), at: now };
  }
  return out;
}

/**
 * How long until `tokens` fit every budget, in whole ms from `now`: 0 when they fit now,
 * `Infinity` when they never can. A request larger than the figure of a budget in `oversize`
 * (the learned ones, learned.ts) fits once that bucket is full.
 */
export function waitToFit(
  figures: BudgetFigures,
  levels: BucketLevels,
  tokens: TokenCost,
  now: number,
  oversize?: ReadonlySet<BudgetName>,
): number {
  let wait = 0;
  for (const name of budgetsOf(figures)) {
    const figure = figures[name]!;
    const bucket = levels[name];
    const cost = costIn(name, tokens);
    const needs = oversize?.has(name) ? Math.min(cost, figure) : cost;
    const fitsAfter = (ms: number) => levelAt(figure, bucket, now + ms) >= needs - FIT_EPSILON;
    // Taking nothing from a budget, a request does not wait for it, even in debt.
    if (cost === 0 || fitsAfter(0)) continue;
    // More than the bucket ever holds (acquire refuses such requests; stored limits may change).
    if (needs > figure + FIT_EPSILON) return Infinity;
    // The first whole millisecond at which it fits, by the same test as at the grant (the
    // estimate alone can be one off either way in floating point).
    // Divided before multiplied: `short * 60_000` overflows to Infinity for figures near
    // Number.MAX_VALUE, and the search below would then never end. `short / figure` is at most 2.
    const short = needs - levelAt(figure, bucket, now);
    let ms = Math.max(1, Math.ceil((short / figure) * MS_PER_MINUTE));
    while (ms > 1 && fitsAfter(ms - 1)) ms--;
    while (!fitsAfter(ms)) ms++;
    wait = Math.max(wait, ms);
  }
  return wait;
}

/**
 * Adds `delta` tokens to every configured bucket, by budget (a charge is a negative delta):
 * never past the figure, never deeper in debt than one figure. Levels must be at `now`.
 */
export function adjust(
  figures: BudgetFigures,
  levels: BucketLevels,
  delta: (name: BudgetName) => number,
  now: number,
): BucketLevels {
  const out: Partial<Record<BudgetName, BucketLevel>> = {};
  for (const name of budgetsOf(figures)) {
    const figure = figures[name]!;
    const bucket = levels[name];
    // A NaN change (Infinity - Infinity from a caller's figures) changes nothing: a NaN level
    // would compare false with every cost, and the wait for a refill would never end.
    const change = delta(name);
    const level = levelAt(figure, bucket, now) + (Number.isNaN(change) ? 0 : change);
    out[name] = {
      level: Math.min(figure, Math.max(-MAX_DEBT_FIGURES * figure, level)),
      at: now,
    };
  }
  return out;
}

/** Takes `tokens` (and 1 request) from every budget. */
export function charge(
  figures: BudgetFigures,
  levels: BucketLevels,
  tokens: TokenCost,
  now: number,
): BucketLevels {
  return adjust(figures, levels, (name) => -costIn(name, tokens), now);
}

/** `stats().budgets`: what a grant could take now (never below 0) and each figure. */
export function budgetStats(
  figures: BudgetFigures,
  levels: BucketLevels,
  now: number,
): BudgetsStats | undefined {
  const names = budgetsOf(figures);
  if (names.length === 0) return undefined;
  const out: Partial<Record<BudgetName, { available: number; capacity: number }>> = {};
  for (const name of names) {
    const figure = figures[name]!;
    out[name] = { available: Math.max(0, Math.floor(levelAt(figure, levels[name], now))), capacity: figure };
  }
  return out;
}
