import { randomUUID } from 'node:crypto';
import type { TokenCost } from './budgets.js';

// Lease ids: a random prefix per process and a counter shared by every limiter in it, so an
// id is never handed out twice, not by two limiters, not by two processes.
const idPrefix = randomUUID().slice(0, 8);
let idCounter = 0;

/** A lease id never handed out before in this process, nor in another. */
export function newLeaseId(): string {
  return `${idPrefix}-${++idCounter}`;
}

/** One lease the in-memory limiter holds. */
export interface LeaseRecord {
  readonly workload: number;
  expiresAt: number;
  /** What the grant took from the token budgets, settled at release. */
  readonly tokens: TokenCost;
  /** The grant's number in this limiter: tells the adaptive limit which answers are news. */
  readonly grant: number;
}

const NONE: readonly LeaseRecord[] = [];

/**
 * The in-memory limiter's leases in expiry order: every lease has the same TTL, so a map in
 * insertion order is in expiry order as long as a renewal moves its lease to the end. Only the
 * first entry needs watching, and the earliest expiry lets the hot path skip the sweep.
 */
export class LeaseBook {
  readonly #leases = new Map<string, LeaseRecord>();
  /** No lease expires before this time. */
  #earliestExpiry = Infinity;

  get(id: string): LeaseRecord | undefined {
    return this.#leases.get(id);
  }

  add(id: string, record: LeaseRecord): void {
    this.#leases.set(id, record);
    if (record.expiresAt < this.#earliestExpiry) this.#earliestExpiry = record.expiresAt;
  }

  /** Takes the lease out (released); whether it was held. */
  take(id: string): boolean {
    return this.#leases.delete(id);
  }

  /** Pushes the lease's expiry to `expiresAt`, keeping the book in expiry order. */
  renew(id: string, record: LeaseRecord, expiresAt: number): void {
    record.expiresAt = expiresAt;
    this.#leases.delete(id);
    this.#leases.set(id, record);
  }

  /** When the first lease expires; undefined with none held. */
  firstExpiry(): number | undefined {
    const first = this.#leases.values().next();
    return first.done ? undefined : first.value.expiresAt;
  }

  /** Takes out every lease whose time is up at `now`, and returns them. */
  takeExpired(now: number): readonly LeaseRecord[] {
    if (now < this.#earliestExpiry) return NONE;
    const expired: LeaseRecord[] = [];
    this.#earliestExpiry = Infinity;
    for (const [id, record] of this.#leases) {
      if (record.expiresAt > now) {
        this.#earliestExpiry = record.expiresAt;
        break;
      }
      this.#leases.delete(id);
      expired.push(record);
    }
    return expired;
  }
}
