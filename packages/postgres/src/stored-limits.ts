/**
 * The limits as stored in the database (`concurrency_limiters.limits`). Every worker that
 * shares a limiter name must agree on them; allocation always uses the stored ones, so
 * workers never apply two sets of rules at once. Pure: no SQL here.
 */
import type { AllocationLimits, BudgetFigures, CapacityLimits, ResolvedLimits } from 'sluice/concurrency';

export interface StoredLimits {
  readonly maxConcurrent: number;
  readonly maxQueued: number | null;
  readonly leaseTtlMs: number;
  readonly defaultWorkload: string | null;
  readonly workloads: readonly StoredWorkload[];
  /** The budgets' figures by budget name; absent (limits stored before budgets) or null: none. */
  readonly rate?: BudgetFigures | null;
  /** The adaptive limit's settings; absent or null: a fixed limit. */
  readonly adaptive?: { readonly minConcurrent: number } | null;
}

export interface StoredWorkload {
  readonly name: string;
  readonly maxConcurrent: number;
  readonly reserved: number;
  readonly priority: number;
  readonly maxWaitMs: number | null;
}

/** The stored form of resolved limits (JSON has no `undefined`: absent values are `null`, absent `rate` and `adaptive` are left out). */
export function storedForm(limits: ResolvedLimits<string>): StoredLimits {
  return {
    maxConcurrent: limits.maxConcurrent,
    maxQueued: limits.maxQueued ?? null,
    leaseTtlMs: limits.leaseTtlMs,
    defaultWorkload: limits.defaultWorkload ?? null,
    workloads: limits.workloads.map((w) => ({
      name: w.name,
      maxConcurrent: w.maxConcurrent,
      reserved: w.reserved,
      priority: w.priority,
      maxWaitMs: w.maxWaitMs ?? null,
    })),
    // Only when set: the limits of a limiter without them are stored as before budgets.
    ...(limits.rate !== undefined && { rate: limits.rate }),
    ...(limits.adaptive !== undefined && { adaptive: limits.adaptive }),
  };
}

/**
 * Every difference between this worker's limits and the stored ones, each as
 * `<field> <mine> here, <stored> stored`; empty when they agree.
 */
export function differences(mine: StoredLimits, stored: StoredLimits): string[] {
  const out: string[] = [];
  for (const key of ['maxConcurrent', 'maxQueued', 'leaseTtlMs', 'defaultWorkload'] as const) {
    if (mine[key] !== stored[key]) out.push(`${key} ${mine[key]} here, ${stored[key]} stored`);
  }
  for (const key of ['rate', 'adaptive'] as const) {
    // jsonb keeps an object's keys in its own order (shorter keys first), not the order they
    // were written in: compare the sorted entries, or a limiter with two budgets would be
    // refused against the row it stored itself.
    const show = (l: StoredLimits) => canonical(l[key]);
    if (show(mine) !== show(stored)) out.push(`${key} ${show(mine)} here, ${show(stored)} stored`);
  }
  const names = (l: StoredLimits) => l.workloads.map((w) => w.name).join(', ');
  if (names(mine) !== names(stored)) {
    out.push(`workloads (${names(mine)}) here, (${names(stored)}) stored`);
    return out;
  }
  for (const [i, w] of mine.workloads.entries()) {
    const s = stored.workloads[i]!;
    for (const key of ['maxConcurrent', 'reserved', 'priority', 'maxWaitMs'] as const) {
      if (w[key] !== s[key]) out.push(`workloads.${w.name}.${key} ${w[key]} here, ${s[key]} stored`);
    }
  }
  return out;
}

/** An option object as JSON with its keys sorted; `null` when absent. */
function canonical(value: object | null | undefined): string {
  if (value === undefined || value === null) return 'null';
  return JSON.stringify(
    Object.fromEntries(Object.entries(value).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))),
  );
}

/**
 * What `allocate` reads, from stored limits. `sharedSlots` is computed as
 * `resolveLimiterOptions` computes it: `maxConcurrent` minus every reservation.
 */
export function allocationLimits(stored: StoredLimits): AllocationLimits & CapacityLimits {
  const reserved = stored.workloads.reduce((sum, w) => sum + w.reserved, 0);
  return {
    maxConcurrent: stored.maxConcurrent,
    sharedSlots: stored.maxConcurrent - reserved,
    workloads: stored.workloads,
    rate: stored.rate ?? undefined,
    adaptive: stored.adaptive ?? undefined,
  };
}
