/**
 * The allocation rules, as one pure function shared by every built-in limiter (in memory and
 * PostgreSQL), so that they cannot disagree about who gets the next slot.
 *
 * Rules:
 * - at most `maxConcurrent` slots in use, and at most each workload's own ceiling;
 * - reservations are strict: a workload may take one of its reserved slots, or one of the
 *   shared (unreserved) slots; nobody else ever takes its reserved slots, idle or not;
 * - among workloads that have room, the highest `priority` goes first; a tie goes to the
 *   request that has waited longest (lowest arrival `seq`);
 * - within a workload, fair queuing by key (see "Fairness by key" below): the request with the
 *   smallest start tag, then the earliest arrival; requests without a key share one implicit
 *   key, so a workload nobody keys is served in plain arrival order, exactly as before keys;
 * - a workload without room (at its ceiling, or out of shared slots with its reservation
 *   used) is skipped: it never blocks another workload;
 * - a request whose deadline has passed is never granted.
 *
 * Fairness by key (start-time fair queuing, one unit of work per grant):
 * - each workload keeps a virtual time `V`: the start tag of its latest grant (0 at first);
 * - a request of key `k` gets, on arrival, the start tag `max(V, next)`, where `next` is one
 *   more than the tag of `k`'s newest queued request, or, when `k` has none queued, one more
 *   than the tag of `k`'s latest grant (absent: `V`). See {@link startTag};
 * - the workload serves the smallest tag first, ties by arrival ({@link servingOrder}), and a
 *   grant moves `V` up to the granted tag.
 * So each key's requests stay first in, first out, and keys take turns: one grant per key per
 * tag value. A request of a key with nothing queued gets tag `V` (or `V + 1` if that key had
 * the latest grant), so it is never put behind another key's backlog.
 *
 * Starvation bound: every other key holds at most one request per tag value, so a request
 * given tag `V` (a key new to the workload, or one that was not just served) waits for at most
 * `n - 1` grants of other keys, `n` being the keys with requests queued in the workload when it
 * arrives (itself included); one given `V + 1` waits for at most `2 (n - 1)`. Keys that become
 * active later arrive with tags no smaller than `V` and later arrival numbers, so they never
 * overtake a request already given tag `V`. A burst of 1,000 requests of key A therefore
 * delays key B's next request by at most one of A's grants, not 1,000.
 *
 * How keys compose with priority: priority is a property of workloads, keys live inside one
 * workload. The limiter first picks the workload (highest priority among those with room, ties
 * to the oldest head); fairness only decides which request is that workload's head. So a key
 * can never raise its priority, and within equal priority, workloads still tie on arrival.
 * Cancelled or timed-out requests keep the tags they were given: the virtual time is not
 * charged back, which costs only their own key (its later requests keep their places).
 *
 * A grant that leaves the workload's queue empty ends its busy period: every key's latest
 * grant is forgotten but the one just made (so that key still starts one tag later than a
 * newcomer). Keys of one request each are all granted at the same virtual time, which then
 * never moves on; without this, both limiters kept one record per such key for ever.
 *
 * Budgets, the pause and the effective limit (DESIGN.md part 3; the arithmetic: budgets.ts):
 * - while the provider's pause lasts (`now < pausedUntil`) nobody is granted;
 * - the adaptive limit takes the place of `maxConcurrent`, and the shared slots shrink with
 *   it: reservations stay whole and strict inside the effective limit. A cut can leave more
 *   shared slots held than the lowered limit has; they drain as they are released, and a
 *   workload's reserved slots stay free for it meanwhile (bounded by `maxConcurrent`, not by
 *   the lowered limit, which the shared slots held over from before the cut fill);
 * - a grant needs a slot and room in every budget, and takes its cost from each; the budgets
 *   are the configured ones and those learned from the provider's headers (learned.ts), and
 *   a request larger than a learned figure fits once that bucket is full.
 *
 * A head that does not fit a budget yet ("blocked"): the heads are taken in the order above
 * (priority, then arrival), and the first one short of a budget is not skipped the way a
 * workload without a slot is. Instead:
 * - its workload is closed for the pass: nobody behind it in that workload goes first, so
 *   the workload keeps its order (by key, then arrival);
 * - it claims every budget it takes from: for the rest of the pass, a request ranked after it
 *   may be granted only if it takes nothing from any claimed budget. With a request budget
 *   every request takes 1, so nobody ranked after a blocked head is granted; with token
 *   budgets only, a request without tokens may still use a free slot. A request ranked after
 *   it that would take from a claimed budget is blocked in turn (its workload closes, it
 *   claims its own budgets), so the rule reads the same whichever head is looked at first.
 * Why nobody starves: only requests ranked before a blocked head can take from the budgets it
 * waits for, and those are requests of workloads with a higher priority, or of its own
 * priority that arrived before it (a finite set; later arrivals rank after it). The buckets
 * refill continuously and a debt is at most one figure deep, so the head fits within bounded
 * time once the higher-priority traffic leaves room, exactly as for slots; small requests
 * cannot keep a large one waiting by taking the refill in small pieces. Claiming every
 * budget it takes from, not only the ones it is short of, matters: otherwise requests after
 * it could drain budget B while it waits for A, then A while it waits for B. When the
 * blocked head's own workload lacks a slot it is skipped as before; it takes the next slot
 * its workload gets, since it ranks first among the waiters that take from its budgets.
 * `wakeAt` tells the limiter when to look again: the earliest time a head short of a budget
 * will fit, or the end of the pause.
 */

import {
  budgetsOf,
  charge,
  costIn,
  NO_TOKENS,
  refill,
  waitToFit,
  type BucketLevels,
  type BudgetFigures,
  type TokenCost,
} from './budgets.js';
import { MAX_PAUSE_MS } from './capacity.js';
import type { BudgetName } from './capacity-types.js';
import { budgetFigures, learnedOnly, type LearnedBudgets } from './learned.js';

/** The part of the limits the rules read. `ResolvedLimits` satisfies it. */
export interface AllocationLimits {
  readonly maxConcurrent: number;
  /** `maxConcurrent` minus every workload's reservation. */
  readonly sharedSlots: number;
  /** Per-minute figures of the budgets; absent or empty for none. */
  readonly rate?: BudgetFigures | undefined;
  readonly workloads: readonly {
    readonly maxConcurrent: number;
    readonly reserved: number;
    readonly priority: number;
  }[];
}

/** A request waiting for a slot. */
export interface WaitingEntry {
  /** Arrival order across the whole limiter: lower arrived earlier. */
  readonly seq: number;
  /** Time after which the request must not be granted; absent for no deadline. */
  readonly deadline?: number | undefined;
  /**
   * Start tag of fair queuing by key ({@link startTag}); absent counts as 0. Within a workload
   * the sources must yield entries in {@link servingOrder}.
   */
  readonly tag?: number | undefined;
  /** The request's tokens, taken from the token budgets at the grant; absent counts as none. */
  readonly tokens?: TokenCost | undefined;
}

/** What the rules read of the limiter's capacity beside its slots; see {@link CapacityState}. */
export interface AllocationCapacity {
  /** The budgets' levels; a configured budget with no entry is full. */
  readonly buckets: BucketLevels;
  /** No grant before this time (the provider asked for a pause); 0 for none. */
  readonly pausedUntil: number;
  /** The effective concurrency limit, at most `maxConcurrent`. */
  readonly limit: number;
  /**
   * Budgets the provider stated (adaptive limiters, learned.ts): buckets like the configured
   * ones, which win over them; a request larger than one goes when its bucket is full.
   */
  readonly learned?: LearnedBudgets | undefined;
}

/** The longest fairness key accepted, in UTF-16 code units. */
export const MAX_KEY_LENGTH = 256;

/**
 * The key of requests that give none. Keys given by callers are never empty, so it cannot
 * collide with one of theirs.
 */
export const IMPLICIT_KEY = '';

/** What a key's new start tag depends on: the workload's virtual time and the key's history. */
export interface KeyHistory {
  /** The workload's virtual time: the start tag of its latest grant, 0 before any. */
  readonly virtualTime: number;
  /** Start tag of the key's newest queued request; absent when it has none queued. */
  readonly newestQueuedTag?: number | undefined;
  /** Start tag of the key's latest grant; absent when none is remembered. */
  readonly lastGrantTag?: number | undefined;
}

/**
 * The start tag of a key's new request (the PostgreSQL limiter computes the same in SQL, in
 * `concurrency_pass_v3`; `sql/003_fair_keys.sql`).
 *
 * @example
 * startTag({ virtualTime: 7 })                                   // => 7: a key new to the queue
 * startTag({ virtualTime: 7, newestQueuedTag: 950 })             // => 951: behind its own backlog
 * startTag({ virtualTime: 7, lastGrantTag: 7 })                  // => 8: it had the latest grant
 */
export function startTag(history: KeyHistory): number {
  const { virtualTime, newestQueuedTag, lastGrantTag } = history;
  const next =
    newestQueuedTag !== undefined
      ? newestQueuedTag + 1
      : lastGrantTag !== undefined
        ? lastGrantTag + 1
        : virtualTime;
  return Math.max(virtualTime, next);
}

/** The order a workload serves its requests in: smallest start tag, then earliest arrival. */
export function servingOrder(a: WaitingEntry, b: WaitingEntry): number {
  return (a.tag ?? 0) - (b.tag ?? 0) || a.seq - b.seq;
}

export interface AllocationInput<E extends WaitingEntry> {
  readonly limits: AllocationLimits;
  /** Slots in use per workload, indexed like `limits.workloads`. */
  readonly active: readonly number[];
  /**
   * Waiting requests per workload (indexed like `limits.workloads`), in {@link servingOrder}
   * (arrival order when nobody uses keys). Read lazily: only as many entries are taken from
   * each as can be granted.
   */
  readonly waiting: readonly (Iterable<E> | undefined)[];
  /** Current time, in the same clock as the deadlines. */
  readonly now: number;
  /** Budgets, pause and effective limit; absent: slots only, up to `maxConcurrent`. */
  readonly capacity?: AllocationCapacity | undefined;
}

export interface Grant<E> {
  readonly entry: E;
  /** Index of the workload the slot counts against. */
  readonly workload: number;
}

export interface AllocationResult<E> {
  /** Requests to grant now, in the order the rules serve them. */
  readonly grants: Grant<E>[];
  /** Requests passed over because their deadline is gone; the caller rejects them. */
  readonly expired: E[];
  /** The budgets' levels after the grants' charges, brought to `now`. */
  readonly buckets: BucketLevels;
  /**
   * When to look again for a request that waits for a budget or for the end of the pause;
   * absent when nobody does.
   */
  readonly wakeAt: number | undefined;
}

/**
 * Who gets the free slots now. Reads only its input and returns a fresh result.
 *
 * @example
 * allocate({ limits, active: [2, 5], waiting: [interactiveQueue, backgroundQueue], now })
 * // => { grants: [{ entry, workload: 0 }], expired: [] }
 */
export function allocate<E extends WaitingEntry>(input: AllocationInput<E>): AllocationResult<E> {
  const { now, capacity } = input;
  const limits = effectiveLimits(input.limits, capacity?.limit);
  const workloads = limits.workloads;
  const figures = budgetFigures(limits.rate, capacity?.learned);
  const oversize = learnedOnly(limits.rate, capacity?.learned);
  const rated = budgetsOf(figures).length > 0;
  const grants: Grant<E>[] = [];
  const expired: E[] = [];
  let buckets = rated ? refill(figures, capacity?.buckets ?? {}, now) : (capacity?.buckets ?? {});
  // A clock that stepped back must not stretch a pause past its longest.
  const pausedUntil = Math.min(capacity?.pausedUntil ?? 0, now + MAX_PAUSE_MS);
  if (now < pausedUntil) return { grants, expired, buckets, wakeAt: pausedUntil };

  const active = input.active.slice();
  let { total, sharedUsed } = usageOf(limits, active);

  const iterators: (Iterator<E> | undefined)[] = new Array(workloads.length);
  const heads: (E | undefined)[] = new Array(workloads.length);
  const exhausted: boolean[] = new Array(workloads.length).fill(false);
  // Workloads whose head waits for a budget, and the budgets those heads claim.
  const closed: boolean[] = new Array(workloads.length).fill(false);
  const claimed = new Set<BudgetName>();
  let wakeAt: number | undefined;

  // The next grantable request of workload i, skipping those past their deadline.
  const headOf = (i: number): E | undefined => {
    if (heads[i] !== undefined || exhausted[i]) return heads[i];
    let it = iterators[i];
    if (it === undefined) {
      const source = input.waiting[i];
      if (source === undefined) {
        exhausted[i] = true;
        return undefined;
      }
      it = iterators[i] = source[Symbol.iterator]();
    }
    for (;;) {
      const step = it.next();
      if (step.done) {
        exhausted[i] = true;
        return undefined;
      }
      const entry = step.value;
      if (entry.deadline !== undefined && entry.deadline <= now) {
        expired.push(entry);
        continue;
      }
      heads[i] = entry;
      return entry;
    }
  };

  // A reserved slot may be granted past a lowered limit (see above): not `total < limit`.
  const ceiling = input.limits.maxConcurrent;
  for (;;) {
    let best = -1;
    let bestEntry: E | undefined;
    for (let i = 0; i < workloads.length; i++) {
      const w = workloads[i]!;
      if (closed[i] || !canTake(limits, active, i, total, sharedUsed, ceiling)) continue;
      const head = headOf(i);
      if (head === undefined) continue;
      if (
        bestEntry === undefined ||
        w.priority > workloads[best]!.priority ||
        (w.priority === workloads[best]!.priority && head.seq < bestEntry.seq)
      ) {
        best = i;
        bestEntry = head;
      }
    }
    if (bestEntry === undefined) break;
    if (rated) {
      const tokens = bestEntry.tokens ?? NO_TOKENS;
      const names = budgetsOf(figures);
      const wait = waitToFit(figures, buckets, tokens, now, oversize);
      if (wait > 0 || names.some((name) => claimed.has(name) && costIn(name, tokens) > 0)) {
        // Blocked: see "A head that does not fit a budget yet" above.
        closed[best] = true;
        for (const name of names) if (costIn(name, tokens) > 0) claimed.add(name);
        if (wait > 0 && wait !== Infinity) wakeAt = Math.min(wakeAt ?? Infinity, now + wait);
        continue;
      }
      buckets = charge(figures, buckets, tokens, now);
    }
    grants.push({ entry: bestEntry, workload: best });
    if (active[best]! >= workloads[best]!.reserved) sharedUsed++;
    active[best]!++;
    total++;
    heads[best] = undefined;
  }
  return { grants, expired, buckets, wakeAt };
}

/**
 * The limits with the effective limit in place of `maxConcurrent`: the shared slots shrink by
 * as much, so every reservation stays whole (the adaptive floor keeps the limit at or above
 * the reservations, plus one shared slot when a workload reserves none).
 */
export function effectiveLimits(limits: AllocationLimits, limit: number | undefined): AllocationLimits {
  if (limit === undefined || limit >= limits.maxConcurrent) return limits;
  const cut = limits.maxConcurrent - limit;
  return { ...limits, maxConcurrent: limit, sharedSlots: Math.max(0, limits.sharedSlots - cut) };
}

/** Slots in use in all, and how many of them are shared (unreserved) slots. */
function usageOf(limits: AllocationLimits, active: readonly number[]): { total: number; sharedUsed: number } {
  let total = 0;
  let sharedUsed = 0;
  for (let i = 0; i < limits.workloads.length; i++) {
    const n = active[i] ?? 0;
    total += n;
    // A workload's first `reserved` slots are its own; only those beyond come from the shared pool.
    sharedUsed += Math.max(0, n - limits.workloads[i]!.reserved);
  }
  return { total, sharedUsed };
}

/**
 * The one statement of "room": workload `i` may take a slot when the workload is under its
 * ceiling and the slot is one of its reserved ones (under `ceiling`, the configured
 * `maxConcurrent`) or a free shared one (under the effective limit, `limits.maxConcurrent`).
 */
function canTake(
  limits: AllocationLimits,
  active: readonly number[],
  i: number,
  total: number,
  sharedUsed: number,
  ceiling: number,
): boolean {
  const w = limits.workloads[i]!;
  const n = active[i] ?? 0;
  if (n >= w.maxConcurrent) return false;
  if (n < w.reserved) return total < ceiling;
  return total < limits.maxConcurrent && sharedUsed < limits.sharedSlots;
}

/**
 * Whether workload `index` could take one more slot given the slots in use. `ceiling`: the
 * configured `maxConcurrent` when `limits` are {@link effectiveLimits}.
 */
export function hasRoom(
  limits: AllocationLimits,
  active: readonly number[],
  index: number,
  ceiling = limits.maxConcurrent,
): boolean {
  const { total, sharedUsed } = usageOf(limits, active);
  return canTake(limits, active, index, total, sharedUsed, ceiling);
}
