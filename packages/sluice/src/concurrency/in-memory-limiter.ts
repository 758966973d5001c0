import { AbortWatch } from './abort-watch.js';
import { allocate, effectiveLimits, hasRoom } from './allocate.js';
import { budgetsOf, budgetStats, type TokenCost } from './budgets.js';
import {
  capacityAt,
  initialCapacity,
  settleRelease,
  type CapacityState,
  type ReleaseEffect,
} from './capacity.js';
import type { ReleaseDetails } from './capacity-types.js';
import { systemClock, type Clock, type ClockTimer } from './clock.js';
import type { ConcurrencyEvent, ConcurrencyEventListener } from './events.js';
import { limiterErrors, prepareAcquire, statsOf, type LimiterErrors } from './front.js';
import type { AcquireRequest, ConcurrencyLease, ConcurrencyLimiter, ConcurrencyStats } from './limiter.js';
import {
  resolveLimiterOptions,
  resolveWorkload,
  type ConcurrencyLimiterOptions,
  type ResolvedLimits,
} from './options.js';
import { FairQueue, type Lane } from './fair-queue.js';
import { budgetFigures } from './learned.js';
import { LeaseBook, newLeaseId } from './lease-book.js';
import type { Waiter } from './in-memory-waiter.js';

const RESOLVED: Promise<void> = Promise.resolve();

// The waiter's promise is made with one shared executor rather than a fresh closure per
// request: at 100,000 waiters, every object a waiter holds shows up as garbage-collector time.
let capturedResolve: (lease: never) => void = () => {};
let capturedReject: (error: unknown) => void = () => {};
function capture(resolve: (lease: never) => void, reject: (error: unknown) => void): void {
  capturedResolve = resolve;
  capturedReject = reject;
}

/**
 * The built-in limiter for one process. Every grant decision goes through the shared
 * `allocate` rules; grants, timeouts and cancellations settle synchronously, so a request is
 * never both granted and cancelled.
 *
 * Lease expiry uses one timer for the whole limiter: leases sit in expiry order (lease-book.ts),
 * so only the first needs watching. Budgets and the provider's pause use one more, the wake timer: set by each
 * allocation that leaves a request waiting for a refill or for the pause to end, to the
 * earliest moment one can go (allocate's `wakeAt`).
 */
export class InMemoryConcurrencyLimiter<W extends string = 'default'> implements ConcurrencyLimiter<W> {
  readonly name: string;
  readonly limits: ResolvedLimits<W>;

  readonly #clock: Clock;
  readonly #errors: LimiterErrors;
  readonly #queues: FairQueue<Waiter<W>>[];
  readonly #active: number[];
  readonly #leases = new LeaseBook();
  #queued = 0;
  #seq = 0;
  #sweepTimer: ClockTimer | undefined;
  #capacity: CapacityState;
  /** Grants made so far; the latest grant's number. */
  #grants = 0;
  /** Whether any budget is configured. */
  readonly #configuredRated: boolean;
  #wakeTimer: ClockTimer | undefined;
  #wakeAt: number | undefined;
  readonly #listeners = new Set<ConcurrencyEventListener>();
  /** Waiters that wait with a signal: one listener per signal, however many share it. */
  readonly #aborts = new AbortWatch<Waiter<W>>(
    (waiter, reason) => this.#leaveAborted(waiter, reason),
    // Once every waiter of the signal has left: none of them is granted a place it freed.
    () => this.#afterLeave(this.#clock.now()),
  );

  constructor(options: ConcurrencyLimiterOptions<W>) {
    this.limits = resolveLimiterOptions(options);
    this.name = this.limits.name;
    this.#clock = options.clock ?? systemClock;
    this.#errors = limiterErrors(this.limits);
    this.#queues = this.limits.workloads.map(() => new FairQueue<Waiter<W>>());
    this.#active = this.limits.workloads.map(() => 0);
    this.#capacity = initialCapacity(this.limits);
    this.#configuredRated = budgetsOf(this.limits.rate ?? {}).length > 0;
  }

  /**
   * Whether some budget is in force, configured or learned from the provider (adaptive):
   * then a request is tried through `allocate` at once.
   */
  get #rated(): boolean {
    return this.#configuredRated || this.#capacity.learned !== undefined;
  }

  validateWorkload(workload?: string): W {
    return resolveWorkload(this.limits, workload).name;
  }

  maxWaitMs(workload?: string): number | undefined {
    return resolveWorkload(this.limits, workload).maxWaitMs;
  }

  acquire(request: AcquireRequest<W> = {}): Promise<ConcurrencyLease<W>> {
    const prepared = prepareAcquire(this.limits, request);
    if (!prepared.ok) return Promise.reject(prepared.error);
    const { workload, key, timeoutMs, tokens } = prepared;
    const signal = request.signal;

    const now = this.#clock.now();
    this.#capacity = capacityAt(this.limits, this.#capacity, now);
    this.#sweep(now);
    // The pause's end (or a refill) is due but its timer has not run yet (another callback of
    // that moment came first): the requests that waited for it go before this one.
    if (this.#wakeAt !== undefined && this.#wakeAt <= now) this.#drain(now);
    // Slots only: between events every grantable waiter has been granted, so a workload with
    // room has no queue of its own and nobody eligible is ahead: grant at once. With budgets
    // a workload with room may still have a head waiting for a refill; allocate decides.
    if (!this.#rated) {
      if (
        now >= this.#capacity.pausedUntil &&
        hasRoom(this.#slotLimits(), this.#active, workload.index, this.limits.maxConcurrent)
      ) {
        this.#queues[workload.index]!.grantNow(key);
        return Promise.resolve(this.#grant(workload.index, tokens, now));
      }
      const refusal = this.#refusal(workload.name, request, timeoutMs, this.#queued);
      if (refusal !== undefined) return Promise.reject(refusal);
    }

    const promise = new Promise<ConcurrencyLease<W>>(capture);
    const waiter: Waiter<W> = {
      prev: undefined,
      next: undefined,
      queued: false,
      seq: this.#seq++,
      tag: 0,
      lane: undefined as Lane<Waiter<W>> | undefined,
      deadline: undefined,
      tokens,
      // Times are kept only when a deadline exists: each is a heap number per waiter.
      enqueuedAt: timeoutMs === undefined ? undefined : now,
      workload,
      request,
      timeoutMs,
      timer: undefined,
      signal: undefined,
      resolve: capturedResolve,
      reject: capturedReject,
    };
    this.#queues[workload.index]!.push(waiter, key);
    this.#queued++;
    // While paused, this arms the wake timer for the pause's end.
    if (!this.#rated && now < this.#capacity.pausedUntil) this.#drain(now);
    if (this.#rated) {
      // Tried as if queued: granted now if the rules would, else refused or left waiting.
      this.#drain(now);
      if (!waiter.queued) return promise;
      const refusal = this.#refusal(workload.name, request, timeoutMs, this.#queued - 1);
      if (refusal !== undefined) {
        this.#dequeue(waiter);
        waiter.reject(refusal);
        return promise;
      }
    }
    if (timeoutMs !== undefined) {
      waiter.deadline = now + timeoutMs;
      waiter.timer = this.#clock.setTimeout(() => {
        waiter.timer = undefined;
        if (!waiter.queued) return;
        const at = this.#clock.now();
        this.#expire(waiter, at);
        this.#afterLeave(at);
      }, timeoutMs);
    }
    if (signal?.aborted) {
      // Aborted while it was being queued (by a listener of the limiter's events, say).
      this.#leaveAborted(waiter, signal.reason);
      this.#afterLeave(this.#clock.now());
    } else if (signal) {
      this.#aborts.watch(signal, waiter);
      waiter.signal = signal;
    }
    return promise;
  }

  /** A waiter whose signal aborted leaves with its reason, if it still waits. */
  #leaveAborted(waiter: Waiter<W>, reason: unknown): void {
    if (!waiter.queued) return;
    this.#dequeue(waiter);
    waiter.reject(reason);
  }

  /**
   * A waiter left without a grant. With slots only that frees nothing; with budgets it may
   * have been a head waiting for a refill, which held back the requests ranked after it.
   */
  #afterLeave(now: number): void {
    if (this.#rated) this.#drain(now);
  }

  /** Why a request that cannot have a slot now may not wait either: a full queue, or no time to wait. */
  #refusal(
    workload: W,
    request: AcquireRequest<W>,
    timeoutMs: number | undefined,
    queued: number,
  ): Error | undefined {
    const maxQueued = this.limits.maxQueued;
    if (maxQueued !== undefined && queued >= maxQueued)
      return this.#errors.queueFull(workload, request, queued);
    // A workload whose maxWaitMs is 0 takes a free slot or none.
    if (timeoutMs !== undefined && timeoutMs <= 0)
      return this.#errors.timeout(workload, request, 0, timeoutMs);
    return undefined;
  }

  /** The slot limits with the adaptive limit in place of `maxConcurrent`. */
  #slotLimits() {
    return effectiveLimits(this.limits, this.#capacity.limit);
  }

  /**
   * Hears the limiter's own events: `provider-throttled` when a release paused it, and
   * `limit-changed` when the adaptive limit moved. Returns the function that stops it. A
   * listener that throws is ignored.
   */
  subscribe(listener: ConcurrencyEventListener): () => void {
    this.#listeners.add(listener);
    return () => {
      this.#listeners.delete(listener);
    };
  }

  renew(lease: ConcurrencyLease<W>): Promise<ConcurrencyLease<W> | undefined> {
    const record = this.#leases.get(lease.id);
    if (record === undefined) return Promise.resolve(undefined);
    const now = this.#clock.now();
    if (record.expiresAt <= now) {
      this.#sweep(now);
      return Promise.resolve(undefined);
    }
    this.#leases.renew(lease.id, record, now + this.limits.leaseTtlMs);
    return Promise.resolve({ ...lease, expiresAt: record.expiresAt });
  }

  /**
   * Gives the slot back and settles it: the grant's tokens become `details.usage`, and the
   * provider's answer may pause the limiter or move the adaptive limit (capacity.ts). The
   * answer counts even for a lease no longer held because it expired: the provider said it
   * all the same. A lease not held though its time is not up was released already, and its
   * answer counted then (a record is only swept once past the lease's `expiresAt`).
   */
  release(lease: ConcurrencyLease<W>, details?: ReleaseDetails): Promise<void> {
    const record = this.#leases.get(lease.id);
    if (record === undefined && details?.provider === undefined) return RESOLVED;
    const now = this.#clock.now();
    if (record === undefined && lease.expiresAt > now) return RESOLVED;
    this.#capacity = capacityAt(this.limits, this.#capacity, now);
    const active = this.#active.reduce((a, b) => a + b, 0);
    if (record !== undefined) {
      this.#leases.take(lease.id);
      this.#active[record.workload]!--;
    }
    if (details !== undefined) {
      const effect = settleRelease(this.limits, this.#capacity, {
        now,
        charged: record?.tokens,
        grant: record?.grant,
        newestGrant: this.#grants,
        active,
        details,
      });
      this.#capacity = effect.state;
      // Heard after the waiters are served: a listener that acquires queues behind them.
      this.#drain(now);
      this.#announce(effect, lease.workload, now);
      return RESOLVED;
    }
    this.#drain(now);
    return RESOLVED;
  }

  stats(): ConcurrencyStats<W> {
    const now = this.#clock.now();
    this.#capacity = capacityAt(this.limits, this.#capacity, now);
    this.#sweep(now);
    return statsOf(
      this.limits,
      { active: this.#active, queued: this.#queues.map((q) => q.size) },
      {
        limit: this.#capacity.limit,
        // Learned budgets too (learned.ts): they hold grants back exactly as configured ones.
        budgets: budgetStats(
          budgetFigures(this.limits.rate, this.#capacity.learned),
          this.#capacity.buckets,
          now,
        ),
      },
    );
  }

  #announce(effect: ReleaseEffect, workload: string, now: number): void {
    if (this.#listeners.size === 0) return;
    const base = { limiter: this.name, workload, at: now };
    if (effect.throttled) this.#emit({ ...base, type: 'provider-throttled', ...effect.throttled });
    if (effect.limitChanged) this.#emit({ ...base, type: 'limit-changed', ...effect.limitChanged });
  }

  #emit(event: ConcurrencyEvent): void {
    for (const listener of this.#listeners) {
      try {
        listener(event);
      } catch {
        // A listener cannot break the limiter.
      }
    }
  }

  #grant(workload: number, tokens: TokenCost, now: number): ConcurrencyLease<W> {
    const id = newLeaseId();
    const expiresAt = now + this.limits.leaseTtlMs;
    this.#leases.add(id, { workload, expiresAt, tokens, grant: ++this.#grants });
    this.#active[workload]!++;
    if (this.#sweepTimer === undefined) this.#armSweep(now);
    return {
      id,
      limiter: this.name,
      workload: this.limits.workloads[workload]!.name,
      acquiredAt: now,
      expiresAt,
    };
  }

  #dequeue(waiter: Waiter<W>, granted = false): void {
    const queue = this.#queues[waiter.workload.index]!;
    if (granted) queue.grant(waiter);
    else queue.remove(waiter);
    this.#queued--;
    if (waiter.timer !== undefined) {
      this.#clock.clearTimeout(waiter.timer);
      waiter.timer = undefined;
    }
    if (waiter.signal !== undefined) {
      this.#aborts.unwatch(waiter.signal, waiter);
      waiter.signal = undefined;
    }
    if (this.#queued === 0) this.#armWake(undefined, 0);
  }

  #expire(waiter: Waiter<W>, now: number): void {
    this.#dequeue(waiter);
    const waitMs = now - (waiter.enqueuedAt ?? now);
    waiter.reject(this.#errors.timeout(waiter.workload.name, waiter.request, waitMs, waiter.timeoutMs ?? 0));
  }

  /** Gives free slots to waiters, by the shared rules. */
  #drain(now: number): void {
    if (this.#queued === 0) return;
    const { grants, expired, buckets, wakeAt } = allocate({
      limits: this.limits,
      active: this.#active,
      waiting: this.#queues,
      now,
      capacity: this.#capacity,
    });
    if (this.#rated) this.#capacity = { ...this.#capacity, buckets };
    for (const waiter of expired) this.#expire(waiter, now);
    for (const { entry: waiter, workload } of grants) {
      this.#dequeue(waiter, true);
      waiter.resolve(this.#grant(workload, waiter.tokens, now));
    }
    this.#armWake(this.#queued > 0 ? wakeAt : undefined, now);
  }

  /** The one wake timer: for the earliest moment a waiting request may fit, or none. */
  #armWake(at: number | undefined, now: number): void {
    if (at === this.#wakeAt && (at === undefined || this.#wakeTimer !== undefined)) return;
    if (this.#wakeTimer !== undefined) this.#clock.clearTimeout(this.#wakeTimer);
    this.#wakeTimer = undefined;
    this.#wakeAt = at;
    if (at === undefined) return;
    this.#wakeTimer = this.#clock.setTimeout(() => {
      this.#wakeTimer = undefined;
      this.#wakeAt = undefined;
      const t = this.#clock.now();
      this.#capacity = capacityAt(this.limits, this.#capacity, t);
      this.#sweep(t);
      this.#drain(t);
    }, at - now);
  }

  /** Drops leases whose time is up, then hands their slots on. */
  #sweep(now: number): void {
    const expired = this.#leases.takeExpired(now);
    for (const record of expired) this.#active[record.workload]!--;
    if (expired.length > 0) this.#drain(now);
  }

  #armSweep(now: number): void {
    const first = this.#leases.firstExpiry();
    if (first === undefined) return;
    this.#sweepTimer = this.#clock.setTimeout(
      () => {
        this.#sweepTimer = undefined;
        const at = this.#clock.now();
        this.#sweep(at);
        this.#armSweep(at);
      },
      first - now,
      { background: true },
    );
  }
}

/**
 * Creates a limiter for one process. Workload names become types, so a misspelt workload
 * fails to compile.
 *
 * @example
 * const claude = createConcurrencyLimiter({
 *   name: 'claude',
 *   maxConcurrent: 8,
 *   workloads: {
 *     interactive: { reserved: 2, priority: 10, maxWaitMs: 60_000 },
 *     background: { maxConcurrent: 6 },
 *   },
 * }); // InMemoryConcurrencyLimiter<'interactive' | 'background'>
 */
export function createConcurrencyLimiter<W extends string = 'default'>(
  options: ConcurrencyLimiterOptions<W>,
): InMemoryConcurrencyLimiter<W> {
  return new InMemoryConcurrencyLimiter(options);
}
