import { randomUUID } from 'node:crypto';
import { allocate, hasRoom } from './allocate.js';
import { systemClock, type Clock, type ClockTimer } from './clock.js';
import { limiterErrors, prepareAcquire, statsOf, type LimiterErrors } from './front.js';
import type { AcquireRequest, ConcurrencyLease, ConcurrencyLimiter, ConcurrencyStats } from './limiter.js';
import {
  resolveLimiterOptions,
  resolveWorkload,
  type ConcurrencyLimiterOptions,
  type ResolvedLimits,
  type ResolvedWorkload,
} from './options.js';
import { FairQueue, type FairNode, type Lane } from './fair-queue.js';

/** A request in the queue. It carries its own list links, so removal is O(1). */
interface Waiter<W extends string> extends FairNode<Waiter<W>> {
  readonly seq: number;
  readonly deadline: number | undefined;
  readonly workload: ResolvedWorkload<W>;
  readonly request: AcquireRequest<W>;
  readonly enqueuedAt: number | undefined;
  readonly timeoutMs: number | undefined;
  timer: ClockTimer | undefined;
  onAbort: (() => void) | undefined;
  resolve(lease: ConcurrencyLease<W>): void;
  reject(error: unknown): void;
}

interface LeaseRecord {
  readonly workload: number;
  expiresAt: number;
}

// Lease ids: a random prefix per process and a counter shared by every limiter in it, so an
// id is never handed out twice, not by two limiters, not by two processes.
const idPrefix = randomUUID().slice(0, 8);
let idCounter = 0;

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
 * Lease expiry uses one timer for the whole limiter: leases sit in a map in expiry order (a
 * renewal moves a lease to the end, and all leases share one TTL), so only the first entry
 * needs watching.
 */
export class InMemoryConcurrencyLimiter<W extends string = 'default'> implements ConcurrencyLimiter<W> {
  readonly name: string;
  readonly limits: ResolvedLimits<W>;

  readonly #clock: Clock;
  readonly #errors: LimiterErrors;
  readonly #queues: FairQueue<Waiter<W>>[];
  readonly #active: number[];
  readonly #leases = new Map<string, LeaseRecord>();
  #queued = 0;
  #seq = 0;
  /** No lease expires before this time; lets the hot path skip the sweep. */
  #earliestExpiry = Infinity;
  #sweepTimer: ClockTimer | undefined;

  constructor(options: ConcurrencyLimiterOptions<W>) {
    this.limits = resolveLimiterOptions(options);
    this.name = this.limits.name;
    this.#clock = options.clock ?? systemClock;
    this.#errors = limiterErrors(this.limits);
    this.#queues = this.limits.workloads.map(() => new FairQueue<Waiter<W>>());
    this.#active = this.limits.workloads.map(() => 0);
  }

  validateWorkload(workload?: string): W {
    return resolveWorkload(this.limits, workload).name;
  }

  acquire(request: AcquireRequest<W> = {}): Promise<ConcurrencyLease<W>> {
    const prepared = prepareAcquire(this.limits, request);
    if (!prepared.ok) return Promise.reject(prepared.error);
    const { workload, key, timeoutMs } = prepared;
    const signal = request.signal;

    const now = this.#clock.now();
    this.#sweep(now);
    // Between events every grantable waiter has been granted, so a workload with room has no
    // queue of its own and nobody eligible is ahead: grant at once.
    if (hasRoom(this.limits, this.#active, workload.index)) {
      this.#queues[workload.index]!.grantNow(key);
      return Promise.resolve(this.#grant(workload.index, now));
    }
    const maxQueued = this.limits.maxQueued;
    if (maxQueued !== undefined && this.#queued >= maxQueued) {
      return Promise.reject(this.#errors.queueFull(workload.name, request, this.#queued));
    }
    // A workload whose maxWaitMs is 0 takes a free slot or none.
    if (timeoutMs !== undefined && timeoutMs <= 0) {
      return Promise.reject(this.#errors.timeout(workload.name, request, 0, timeoutMs));
    }

    const promise = new Promise<ConcurrencyLease<W>>(capture);
    const waiter: Waiter<W> = {
      prev: undefined,
      next: undefined,
      queued: false,
      seq: this.#seq++,
      tag: 0,
      lane: undefined as Lane<Waiter<W>> | undefined,
      // Times are kept only when a deadline exists: each is a heap number per waiter.
      deadline: timeoutMs === undefined ? undefined : now + timeoutMs,
      enqueuedAt: timeoutMs === undefined ? undefined : now,
      workload,
      request,
      timeoutMs,
      timer: undefined,
      onAbort: undefined,
      resolve: capturedResolve,
      reject: capturedReject,
    };
    this.#queues[workload.index]!.push(waiter, key);
    this.#queued++;
    if (timeoutMs !== undefined) {
      waiter.timer = this.#clock.setTimeout(() => {
        waiter.timer = undefined;
        if (waiter.queued) this.#expire(waiter, this.#clock.now());
      }, timeoutMs);
    }
    if (signal) {
      waiter.onAbort = () => {
        if (!waiter.queued) return;
        this.#dequeue(waiter);
        waiter.reject(signal.reason);
      };
      signal.addEventListener('abort', waiter.onAbort, { once: true });
    }
    return promise;
  }

  renew(lease: ConcurrencyLease<W>): Promise<ConcurrencyLease<W> | undefined> {
    const record = this.#leases.get(lease.id);
    if (record === undefined) return Promise.resolve(undefined);
    const now = this.#clock.now();
    if (record.expiresAt <= now) {
      this.#sweep(now);
      return Promise.resolve(undefined);
    }
    record.expiresAt = now + this.limits.leaseTtlMs;
    // Re-insert so the map stays in expiry order.
    this.#leases.delete(lease.id);
    this.#leases.set(lease.id, record);
    return Promise.resolve({ ...lease, expiresAt: record.expiresAt });
  }

  release(lease: ConcurrencyLease<W>): Promise<void> {
    const record = this.#leases.get(lease.id);
    if (record === undefined) return RESOLVED;
    this.#leases.delete(lease.id);
    this.#active[record.workload]!--;
    this.#drain(this.#clock.now());
    return RESOLVED;
  }

  stats(): ConcurrencyStats<W> {
    this.#sweep(this.#clock.now());
    return statsOf(this.limits, { active: this.#active, queued: this.#queues.map((q) => q.size) });
  }

  #grant(workload: number, now: number): ConcurrencyLease<W> {
    const id = `${idPrefix}-${++idCounter}`;
    const expiresAt = now + this.limits.leaseTtlMs;
    this.#leases.set(id, { workload, expiresAt });
    if (expiresAt < this.#earliestExpiry) this.#earliestExpiry = expiresAt;
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
    if (waiter.onAbort !== undefined) {
      waiter.request.signal?.removeEventListener('abort', waiter.onAbort);
      waiter.onAbort = undefined;
    }
  }

  #expire(waiter: Waiter<W>, now: number): void {
    this.#dequeue(waiter);
    const waitMs = now - (waiter.enqueuedAt ?? now);
    waiter.reject(this.#errors.timeout(waiter.workload.name, waiter.request, waitMs, waiter.timeoutMs ?? 0));
  }

  /** Gives free slots to waiters, by the shared rules. */
  #drain(now: number): void {
    if (this.#queued === 0) return;
    const { grants, expired } = allocate({
      limits: this.limits,
      active: this.#active,
      waiting: this.#queues,
      now,
    });
    for (const waiter of expired) this.#expire(waiter, now);
    for (const { entry: waiter, workload } of grants) {
      this.#dequeue(waiter, true);
      waiter.resolve(this.#grant(workload, now));
    }
  }

  /** Drops leases whose time is up, then hands their slots on. */
  #sweep(now: number): void {
    if (now < this.#earliestExpiry) return;
    let freed = false;
    this.#earliestExpiry = Infinity;
    for (const [id, record] of this.#leases) {
      if (record.expiresAt > now) {
        this.#earliestExpiry = record.expiresAt;
        break;
      }
      this.#leases.delete(id);
      this.#active[record.workload]!--;
      freed = true;
    }
    if (freed) this.#drain(now);
  }

  #armSweep(now: number): void {
    const first = this.#leases.values().next();
    if (first.done) return;
    this.#sweepTimer = this.#clock.setTimeout(
      () => {
        this.#sweepTimer = undefined;
        const at = this.#clock.now();
        this.#sweep(at);
        this.#armSweep(at);
      },
      first.value.expiresAt - now,
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
