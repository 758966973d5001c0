/**
 * The capacity of a PostgreSQL limiter (budgets, the provider's pause, the adaptive limit) as
 * stored in its row, and what the releases of one pass do to it: the same `settleRelease`
 * the in-memory limiter runs, on the state every process shares, in database time. Pure.
 */
import {
  BUDGET_NAMES,
  budgetFigures,
  capacityAt,
  initialCapacity,
  parseLearned,
  settleRelease,
  type AllocationLimits,
  type BucketLevels,
  type CapacityLimits,
  type CapacityState,
  type ReleaseEffect,
} from 'sluice/concurrency';
import type { PassState, SettledRelease } from './pass.js';

/** What a settled release did, for the events of the process that reported it. */
export type ReleaseOutcome = Pick<ReleaseEffect, 'throttled' | 'limitChanged'>;

const finite = (value: unknown): value is number => typeof value === 'number' && Number.isFinite(value);

/**
 * The stored capacity, brought to `nowMs`. NULL (never written) or anything that is not a
 * well-formed state is the initial one (budgets full, no pause, the limit at maxConcurrent),
 * field by field: a damaged row must not wedge the limiter.
 */
export function parseCapacity(
  limits: AllocationLimits & CapacityLimits,
  json: string | null,
  nowMs: number,
): CapacityState {
  const initial = initialCapacity(limits);
  let raw: unknown;
  try {
    raw = json === null ? undefined : JSON.parse(json);
  } catch {
    raw = undefined;
  }
  const state = typeof raw === 'object' && raw !== null ? (raw as Record<string, unknown>) : {};
  const adaptive = limits.adaptive;
  // Budgets learned from the provider's headers (adaptive only; rows of before them have none).
  const learned = adaptive === undefined ? undefined : parseLearned(state.learned);
  const figures = budgetFigures(limits.rate, learned);
  const buckets: Partial<Record<(typeof BUDGET_NAMES)[number], { level: number; at: number }>> = {};
  const storedBuckets = typeof state.buckets === 'object' && state.buckets !== null ? state.buckets : {};
  for (const name of BUDGET_NAMES) {
    const b = (storedBuckets as Record<string, unknown>)[name] as
      { level?: unknown; at?: unknown } | undefined;
    if (figures[name] !== undefined && b && finite(b.level) && finite(b.at)) {
      buckets[name] = { level: b.level, at: b.at };
    }
  }
  // A limit outside the bounds (a damaged row, or limits replaced since) starts over at the top.
  const limit =
    adaptive !== undefined &&
    Number.isSafeInteger(state.limit) &&
    (state.limit as number) >= adaptive.minConcurrent &&
    (state.limit as number) <= limits.maxConcurrent
      ? (state.limit as number)
      : initial.limit;
  const parsed: CapacityState = {
    buckets: buckets as BucketLevels,
    pausedUntil: finite(state.pausedUntil) ? state.pausedUntil : 0,
    limit,
    successes: adaptive !== undefined && finite(state.successes) ? state.successes : 0,
    ignoreUpTo: finite(state.ignoreUpTo) ? state.ignoreUpTo : 0,
    refusedAt: adaptive !== undefined && finite(state.refusedAt) ? state.refusedAt : undefined,
    ...(learned !== undefined && { learned }),
  };
  return capacityAt(limits, parsed, nowMs);
}

/**
 * The capacity after the pass's settled releases, in the order they came. `active` for the
 * adaptive limit is the slots held before this pass's releases: after them, plus those it
 * released.
 */
export function capacityOfPass(
  limits: AllocationLimits & CapacityLimits,
  state: PassState,
  settled: readonly SettledRelease[],
): { capacity: CapacityState; releases: Map<string, ReleaseOutcome> } {
  let capacity = state.capacity;
  const releases = new Map<string, ReleaseOutcome>();
  if (settled.length === 0) return { capacity, releases };
  const held = new Map(state.released.map((r) => [r.leaseId, r]));
  const active = state.active.reduce((a, b) => a + b, 0) + state.released.length;
  for (const release of settled) {
    const row = held.get(release.leaseId);
    const effect = settleRelease(limits, capacity, {
      now: state.nowMs,
      charged: row?.tokens,
      // A lease already gone (expired) is known by the fence its holder passes.
      grant: row?.fence ?? release.fence,
      newestGrant: state.newestFence,
      active,
      details: release.details,
    });
    capacity = effect.state;
    releases.set(release.leaseId, { throttled: effect.throttled, limitChanged: effect.limitChanged });
  }
  return { capacity, releases };
}
