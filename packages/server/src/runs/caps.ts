/**
 * The cap rule: whether a run has room in a counted set. Every place that asks uses these
 * functions, so they cannot disagree about "full":
 * - admission's batch decisions, from a plain read and under the tenant's lock (`Tally` in
 *   admission-counts.ts);
 * - the bound the one-statement fast path checks in SQL (`highestFitting`, through
 *   `highestCounts` into `sluice_admit_runs`, sql/016_admission_fast_path.sql);
 * - promotion of due scheduled runs into the default-class cap (scheduler.ts `choosePromotions`);
 * - the deferred running cap when a worker claims (claims.ts).
 * The per-user cap on held runs is a counted place in the cache store (cache/places.ts), which
 * takes a place atomically there and refuses at the same boundary.
 *
 * Rules:
 * - a cap of 0 means no cap: there is always room;
 * - a set with cap `c` has room for `n` more runs while its count is at most `c - n`, so a
 *   count at or above `c` (one that drifted past it too) leaves no room;
 * - the k-th run of a batch to enter a set fits while the count read before the batch is at
 *   most `c - k` (`highestFitting`); `sluice_admit_runs` writes the batch only when every
 *   counter row is at most its bound, which is `hasRoom(count, c, k)` for each run;
 * - a run is checked against its caps in order, tenant first, then project: the first without
 *   room is the one reported (`firstFull`).
 *
 * Which set a run counts in (and so which cap applies) is the same in TypeScript and SQL:
 * `setOf` in admission-counts.ts for a new run, `sluice_admission_set(class, status)`
 * (sql/015_admission_counters.sql) for a stored one; caps.test.ts holds the two equal.
 */

/** Whether `more` runs fit beside `count` under `cap` (0: no cap). */
export function hasRoom(count: number, cap: number, more = 1): boolean {
  return cap <= 0 || count + more <= cap;
}

/**
 * The highest count at which `k` more runs still fit under `cap`; null for no cap. The SQL
 * fast path compares counts with it: `count > highest` is `!hasRoom(count, cap, k)`.
 */
export function highestFitting(cap: number, k: number): number | null {
  return cap <= 0 ? null : cap - k;
}

/** One cap a run is counted against. */
export interface CapLevel<Scope extends string = string> {
  scope: Scope;
  cap: number;
  count: number;
}

/** The first of `levels` (in the order given) that has no room for one more run. */
export function firstFull<Scope extends string>(
  levels: readonly CapLevel<Scope>[],
): CapLevel<Scope> | undefined {
  return levels.find((level) => !hasRoom(level.count, level.cap));
}

/** The most a counter row's counts may be for a batch to fit; null: that count has no cap. */
export interface HighestCounts {
  project: string;
  active: number | null;
  scheduled: number | null;
  deferred: number | null;
}
