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
 * - within a workload, arrival order;
 * - a workload without room (at its ceiling, or out of shared slots with its reservation
 *   used) is skipped: it never blocks another workload;
 * - a request whose deadline has passed is never granted.
 */

/** The part of the limits the rules read. `ResolvedLimits` satisfies it. */
export interface AllocationLimits {
  readonly maxConcurrent: number;
  /** `maxConcurrent` minus every workload's reservation. */
  readonly sharedSlots: number;
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
}

export interface AllocationInput<E extends WaitingEntry> {
  readonly limits: AllocationLimits;
  /** Slots in use per workload, indexed like `limits.workloads`. */
  readonly active: readonly number[];
  /**
   * Waiting requests per workload (indexed like `limits.workloads`), oldest first. Read lazily:
   * only as many entries are taken from each as can be granted.
   */
  readonly waiting: readonly (Iterable<E> | undefined)[];
  /** Current time, in the same clock as the deadlines. */
  readonly now: number;
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
}

/**
 * Who gets the free slots now. Reads only its input and returns a fresh result.
 *
 * @example
 * allocate({ limits, active: [2, 5], waiting: [interactiveQueue, backgroundQueue], now })
 * // => { grants: [{ entry, workload: 0 }], expired: [] }
 */
export function allocate<E extends WaitingEntry>(input: AllocationInput<E>): AllocationResult<E> {
  const { limits, now } = input;
  const workloads = limits.workloads;
  const grants: Grant<E>[] = [];
  const expired: E[] = [];

  const active = input.active.slice();
  let { total, sharedUsed } = usageOf(limits, active);

  const iterators: (Iterator<E> | undefined)[] = new Array(workloads.length);
  const heads: (E | undefined)[] = new Array(workloads.length);
  const exhausted: boolean[] = new Array(workloads.length).fill(false);

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

  while (total < limits.maxConcurrent) {
    let best = -1;
    let bestEntry: E | undefined;
    for (let i = 0; i < workloads.length; i++) {
      const w = workloads[i]!;
      if (!canTake(limits, active, i, total, sharedUsed)) continue;
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
    grants.push({ entry: bestEntry, workload: best });
    if (active[best]! >= workloads[best]!.reserved) sharedUsed++;
    active[best]!++;
    total++;
    heads[best] = undefined;
  }
  return { grants, expired };
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
 * The one statement of "room": workload `i` may take a slot when the limiter and the workload
 * are under their ceilings, and the slot is one of its reserved ones or a free shared one.
 */
function canTake(
  limits: AllocationLimits,
  active: readonly number[],
  i: number,
  total: number,
  sharedUsed: number,
): boolean {
  const w = limits.workloads[i]!;
  const n = active[i] ?? 0;
  return (
    total < limits.maxConcurrent && n < w.maxConcurrent && (n < w.reserved || sharedUsed < limits.sharedSlots)
  );
}

/** Whether workload `index` could take one more slot given the slots in use. */
export function hasRoom(limits: AllocationLimits, active: readonly number[], index: number): boolean {
  const { total, sharedUsed } = usageOf(limits, active);
  return canTake(limits, active, index, total, sharedUsed);
}
