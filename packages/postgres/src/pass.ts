/**
 * One allocation pass, between its two SQL calls: decode what `concurrency_pass_v4` read
 * under the limiter's row lock, then decide who gets a slot (the shared `allocate` rules, with
 * the budgets, the pause and the effective limit as stored), what the releases of the pass do
 * to the budgets (pass-capacity.ts), and what becomes of the requests this pass put in the
 * queue. Pure: no SQL; the time is the database's, read in the pass.
 */
import {
  allocate,
  servingOrder,
  type CapacityState,
  type ReleaseDetails,
  type TokenCost,
} from 'sluice/concurrency';
import { capacityOfPass, parseCapacity, type ReleaseOutcome } from './pass-capacity.js';
import type { LeaseRow } from './queries.js';
import { allocationLimits, type StoredLimits } from './stored-limits.js';

/** A row of `concurrency_pass_v4` as the driver returns it (see sql/004_capacity.sql). */
export interface PassRow {
  readonly kind: string;
  readonly workload: string | null;
  readonly count: number | null;
  readonly waiter_id: string | null;
  readonly owner: string | null;
  readonly seq: number | null;
  readonly limits_json: string | null;
  readonly next_expiry_ms: number | null;
  readonly lease_id: string | null;
  readonly fence: number | null;
  readonly acquired_at: number | null;
  readonly expires_at: number | null;
  /** Start tag of a `head` row (fair queuing by key). */
  readonly tag: number | null;
  /** Token estimate of a `head` or `released` row. */
  readonly tokens_in: number | null;
  readonly tokens_out: number | null;
  /** The database's time, in the `capacity` row. */
  readonly now_ms: number | null;
}

/** A request at the head of its workload's queue. */
export interface QueueHead {
  /** Arrival number, across the limiter. */
  readonly seq: number;
  /** Start tag of fair queuing by key: the workload serves the smallest first. */
  readonly tag: number;
  /** The waiter's id. */
  readonly id: string;
  /** The process that waits for it. */
  readonly owner: string;
  readonly workload: string;
  /** Its token estimate. */
  readonly tokens: TokenCost;
}

/** A lease this pass released, as it was stored. */
export interface ReleasedLease {
  readonly leaseId: string;
  readonly fence: number;
  /** What its grant was charged. */
  readonly tokens: TokenCost;
}

/** One row, decoded: a discriminated union on `kind`. */
export type PassItem =
  | { readonly kind: 'present'; readonly waiterId: string }
  | { readonly kind: 'claimed'; readonly lease: LeaseRow }
  | { readonly kind: 'limits'; readonly limits: StoredLimits }
  | { readonly kind: 'active'; readonly workload: string; readonly count: number }
  | { readonly kind: 'queued'; readonly workload: string; readonly count: number }
  | { readonly kind: 'next-expiry'; readonly inMs: number }
  | { readonly kind: 'head'; readonly head: QueueHead }
  | { readonly kind: 'released'; readonly lease: ReleasedLease }
  | {
      readonly kind: 'capacity';
      /** As stored: JSON text, or null when never written. */
      readonly json: string | null;
      readonly newestFence: number;
      readonly nowMs: number;
    };

/** Decodes one row; throws on a kind it does not know or a column its kind needs that is missing. */
export function decodePassRow(row: PassRow): PassItem {
  const need = <K extends keyof PassRow>(column: K): NonNullable<PassRow[K]> => {
    const value = row[column];
    if (value === null || value === undefined) {
      throw new Error(`concurrency_pass_v4 returned a \`${row.kind}\` row without \`${column}\``);
    }
    return value as NonNullable<PassRow[K]>;
  };
  switch (row.kind) {
    case 'present':
      return { kind: 'present', waiterId: need('waiter_id') };
    case 'claimed':
      return {
        kind: 'claimed',
        lease: {
          id: need('lease_id'),
          workload: need('workload'),
          fence: need('fence'),
          owner: need('owner'),
          offered: false,
          waiter_id: need('waiter_id'),
          acquired_at: need('acquired_at'),
          expires_at: need('expires_at'),
        },
      };
    case 'limits':
      return { kind: 'limits', limits: JSON.parse(need('limits_json')) as StoredLimits };
    case 'active':
    case 'queued':
      return { kind: row.kind, workload: need('workload'), count: need('count') };
    case 'next-expiry':
      return { kind: 'next-expiry', inMs: need('next_expiry_ms') };
    case 'head':
      return {
        kind: 'head',
        head: {
          seq: need('seq'),
          id: need('waiter_id'),
          owner: need('owner'),
          workload: need('workload'),
          tag: need('tag'),
          tokens: { input: need('tokens_in'), output: need('tokens_out') },
        },
      };
    case 'released':
      return {
        kind: 'released',
        lease: {
          leaseId: need('lease_id'),
          fence: need('fence'),
          tokens: { input: need('tokens_in'), output: need('tokens_out') },
        },
      };
    case 'capacity':
      return { kind: 'capacity', json: row.limits_json, newestFence: need('fence'), nowMs: need('now_ms') };
    default:
      throw new Error(`concurrency_pass_v4 returned a row of unknown kind \`${row.kind}\``);
  }
}

/** What one pass read, after its sweep: all that the decisions need. */
export interface PassState {
  readonly limits: StoredLimits;
  /** Slots in use per workload, indexed like `limits.workloads`. */
  readonly active: number[];
  /** Requests waiting, in all (the ones this pass added included). */
  readonly queued: number;
  /** The first waiters of each workload, in serving order, indexed like `limits.workloads`. */
  readonly heads: QueueHead[][];
  /** Heartbeated waiters whose queue entry is still there. */
  readonly present: Set<string>;
  /** Offers to heartbeated waiters, claimed by this pass: their leases. */
  readonly claimed: LeaseRow[];
  /** When the next lease lapses, in milliseconds from the pass; absent when none is held. */
  readonly nextExpiryMs: number | undefined;
  /** Leases this pass released that were still held. */
  readonly released: ReleasedLease[];
  /** Budgets, pause and effective limit as stored, brought to `nowMs`. */
  readonly capacity: CapacityState;
  /** The capacity exactly as read, to tell whether the pass must write it back. */
  readonly storedCapacity: string | null;
  /** The database's time when the pass read the state. */
  readonly nowMs: number;
  /** The newest fence handed out so far. */
  readonly newestFence: number;
}

/**
 * Decodes a pass's rows. `undefined` when there is no `limits` row: the function found no
 * limiter of that name. Counts and heads of a workload the stored limits do not name (one
 * removed by `onConflict: 'replace'`) are left out.
 */
export function decodePass(rows: readonly PassRow[]): PassState | undefined {
  const items = rows.map(decodePassRow);
  const limitsItem = items.find((item) => item.kind === 'limits');
  if (limitsItem === undefined) return undefined;
  const limits = limitsItem.limits;
  const index = new Map(limits.workloads.map((w, i) => [w.name, i]));
  const active = limits.workloads.map(() => 0);
  const heads: QueueHead[][] = limits.workloads.map(() => []);
  const present = new Set<string>();
  const claimed: LeaseRow[] = [];
  const released: ReleasedLease[] = [];
  let queued = 0;
  let nextExpiryMs: number | undefined;
  let capacityItem: Extract<PassItem, { kind: 'capacity' }> | undefined;
  for (const item of items) {
    switch (item.kind) {
      case 'limits':
        break;
      case 'capacity':
        capacityItem = item;
        break;
      case 'released':
        released.push(item.lease);
        break;
      case 'present':
        present.add(item.waiterId);
        break;
      case 'claimed':
        claimed.push(item.lease);
        break;
      case 'next-expiry':
        nextExpiryMs = item.inMs;
        break;
      case 'active': {
        const i = index.get(item.workload);
        if (i !== undefined) active[i] = item.count;
        break;
      }
      case 'queued':
        if (index.has(item.workload)) queued += item.count;
        break;
      case 'head': {
        const i = index.get(item.head.workload);
        if (i !== undefined) heads[i]!.push(item.head);
        break;
      }
      default: {
        const unknown: never = item;
        throw new Error(`unhandled pass item ${JSON.stringify(unknown)}`);
      }
    }
  }
  for (const list of heads) list.sort(servingOrder);
  if (capacityItem === undefined) throw new Error('concurrency_pass_v4 returned no `capacity` row');
  const { json, nowMs, newestFence } = capacityItem;
  const capacity = parseCapacity(allocationLimits(limits), json, nowMs);
  return {
    limits,
    active,
    queued,
    heads,
    present,
    claimed,
    nextExpiryMs,
    released,
    capacity,
    storedCapacity: json,
    nowMs,
    newestFence,
  };
}

/** A request this pass puts in the queue. */
export interface Enqueue {
  readonly id: string;
  readonly workload: string;
  /** Its fairness key; `IMPLICIT_KEY` ('') for none. */
  readonly key: string;
  /** How long it may still wait; `undefined` for no deadline, 0 for a free slot or none. */
  readonly timeoutMs: number | undefined;
}

/** What becomes of a request this pass put in the queue. */
export type EnqueueOutcome =
  | { readonly kind: 'granted' }
  | { readonly kind: 'waiting' }
  | { readonly kind: 'queue-full'; readonly queued: number; readonly maxQueued: number }
  | { readonly kind: 'timed-out' };

export interface EnqueueDecisions {
  readonly outcomes: ReadonlyMap<string, EnqueueOutcome>;
  /** Entries to remove again without a grant. */
  readonly dropped: string[];
}

/**
 * What becomes of the requests a pass added, in arrival order: granted if the rules chose
 * them; otherwise refused when the queue already holds `maxQueued` other requests, timed out
 * when they may not wait at all, and waiting otherwise (each one that stays counts against
 * the next).
 */
export function decideEnqueues(input: {
  readonly enqueues: readonly Pick<Enqueue, 'id' | 'timeoutMs'>[];
  /** Every waiter the rules chose in this pass, old entries and new. */
  readonly granted: ReadonlySet<string>;
  /** Requests waiting before the grants, the new ones included. */
  readonly queued: number;
  readonly maxQueued: number | null;
}): EnqueueDecisions {
  const { enqueues, granted, maxQueued } = input;
  const outcomes = new Map<string, EnqueueOutcome>();
  const dropped: string[] = [];
  const newNotGranted = enqueues.filter((e) => !granted.has(e.id)).length;
  // Requests that were already waiting and stay waiting after this pass's grants.
  let others = input.queued - granted.size - newNotGranted;
  for (const e of enqueues) {
    if (granted.has(e.id)) outcomes.set(e.id, { kind: 'granted' });
    else if (maxQueued !== null && others >= maxQueued) {
      outcomes.set(e.id, { kind: 'queue-full', queued: others, maxQueued });
      dropped.push(e.id);
    } else if (e.timeoutMs === 0) {
      outcomes.set(e.id, { kind: 'timed-out' });
      dropped.push(e.id);
    } else {
      outcomes.set(e.id, { kind: 'waiting' });
      others++;
    }
  }
  return { outcomes, dropped };
}

/** A release of this pass that reports how its request went. */
export interface SettledRelease {
  readonly leaseId: string;
  /** The lease's fence, as the caller holds it (also for a lease already gone). */
  readonly fence: number | undefined;
  readonly details: ReleaseDetails;
}

/** The decisions of one pass: who gets a slot, and what becomes of the new requests. */
export interface PassPlan extends EnqueueDecisions {
  /** Waiters to grant now, in the order the rules serve them. */
  readonly grants: QueueHead[];
  /** The capacity to store, or `undefined` when it did not change. */
  readonly capacity: string | undefined;
  /** What each settled release did (a pause, a move of the limit), by lease id. */
  readonly releases: ReadonlyMap<string, ReleaseOutcome>;
  /** When a request waits for a refill or the pause's end, the database time to look again. */
  readonly wakeAt: number | undefined;
}

/**
 * Decides a pass. Deadlines and lapsed entries were swept in SQL, in database time, so the
 * rules see only live entries; budgets and the pause use the database's time of the pass.
 */
export function planPass(
  state: PassState,
  enqueues: readonly Enqueue[],
  settled: readonly SettledRelease[] = [],
): PassPlan {
  const limits = allocationLimits(state.limits);
  const { capacity, releases } = capacityOfPass(limits, state, settled);
  const result = allocate({
    limits,
    active: state.active,
    waiting: state.heads,
    now: state.nowMs,
    capacity,
  });
  const grants = result.grants.map((g) => g.entry);
  const decisions = decideEnqueues({
    enqueues,
    granted: new Set(grants.map((g) => g.id)),
    queued: state.queued,
    maxQueued: state.limits.maxQueued,
  });
  const json = JSON.stringify({ ...capacity, buckets: result.buckets });
  // Written only when it changed: a pass of a limiter without budgets or pause writes nothing.
  const unchanged =
    state.storedCapacity === null ? json === JSON.stringify(initialOf(state)) : json === state.storedCapacity;
  return {
    grants,
    ...decisions,
    capacity: unchanged ? undefined : json,
    releases,
    // Someone still waits (a pause with nobody waiting ends unwatched).
    wakeAt: state.queued - grants.length - decisions.dropped.length > 0 ? result.wakeAt : undefined,
  };
}

function initialOf(state: PassState): CapacityState {
  return parseCapacity(allocationLimits(state.limits), null, state.nowMs);
}
