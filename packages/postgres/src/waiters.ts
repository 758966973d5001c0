import { randomUUID } from 'node:crypto';
import { AbortWatch } from 'sluice/concurrency';
import type {
  AcquireRequest,
  Clock,
  ClockTimer,
  ConcurrencyLease,
  LimiterErrors,
  TokenCost,
} from 'sluice/concurrency';
import type { LeaseRow } from './queries.js';

/**
 * A request of this process waiting for a slot of the PostgreSQL limiter.
 *
 *   starting --ready, queue entry added--> waiting
 *   waiting --granted here, or offer claimed--> done (resolved)
 *   waiting --offer announced--> claiming --claimed--> done | --offer gone--> waiting (enqueued again)
 *   waiting --aborted or deadline--> leaving --queue entry and any offer removed--> done (rejected)
 *   starting | claiming --aborted or deadline--> (noted in `end`; settled when the step returns)
 *   any --database unanswered for outageGraceMs, or close()--> done (rejected)
 */
export interface LocalWaiter {
  readonly id: string;
  readonly workload: string;
  /** Its fairness key ('' for none). */
  readonly key: string;
  readonly request: AcquireRequest<string>;
  /** When the request arrived, on the limiter's clock: its deadline counts from here. */
  readonly startedAt: number;
  /** The wait allowed: the smaller of maxWaitMs and the caller's budget. */
  readonly timeoutMs: number | undefined;
  /** Its token estimate, charged to the budgets at the grant. */
  readonly tokens: TokenCost;
  state: 'starting' | 'waiting' | 'claiming' | 'leaving' | 'done';
  /** The enqueue pass in flight; leaving waits for it, so no queue entry is left behind. */
  enqueued: Promise<unknown> | undefined;
  /** Why the request ends, once cancellation or the deadline has come. */
  end: WaitEnd | undefined;
  timer: ClockTimer | undefined;
  /** The signal it is watched on (the request's, as it was when it asked). */
  signal: AbortSignal | undefined;
  resolve(lease: ConcurrencyLease<string>): void;
  reject(error: unknown): void;
}

/** The caller gave up (`signal.reason`), or the deadline came (a timeout error). */
export interface WaitEnd {
  readonly error: unknown;
  readonly deadline: boolean;
}

/**
 * The requests of one limiter object that wait for a slot: their timers, abort listeners
 * and entries in the process-wide registry through which passes hand over grants. The
 * transitions that need the database are the limiter's; this keeps the bookkeeping.
 */
export class LocalWaiters {
  readonly #all = new Map<string, LocalWaiter>();
  /** One listener per signal, however many of this process's waiters share it. */
  readonly #aborts = new AbortWatch<LocalWaiter>((waiter, reason) =>
    this.on.end(waiter, { error: reason, deadline: false }),
  );

  constructor(
    private readonly clock: Clock,
    private readonly errors: LimiterErrors,
    /** Shared by the limiter objects of one pool: waiter id -> hand over a grant. */
    private readonly registry: Map<string, (row: LeaseRow) => void>,
    private readonly on: {
      granted(waiter: LocalWaiter, row: LeaseRow): void;
      end(waiter: LocalWaiter, end: WaitEnd): void;
    },
  ) {}

  get size(): number {
    return this.#all.size;
  }

  get(id: string): LocalWaiter | undefined {
    return this.#all.get(id);
  }

  /** Every request, in arrival order. */
  list(): LocalWaiter[] {
    return [...this.#all.values()];
  }

  /**
   * A new request, in state `starting`. Its deadline counts from now; a wait of 0 takes a
   * free slot or none, which the enqueue pass decides without a timer.
   */
  add(
    request: AcquireRequest<string>,
    workload: string,
    key: string,
    timeoutMs: number | undefined,
    tokens: TokenCost = { input: 0, output: 0 },
  ): { waiter: LocalWaiter; promise: Promise<ConcurrencyLease<string>> } {
    let resolve!: (lease: ConcurrencyLease<string>) => void;
    let reject!: (error: unknown) => void;
    const promise = new Promise<ConcurrencyLease<string>>((res, rej) => ((resolve = res), (reject = rej)));
    const waiter: LocalWaiter = {
      id: randomUUID(),
      workload,
      key,
      tokens,
      request,
      startedAt: this.clock.now(),
      timeoutMs,
      state: 'starting',
      enqueued: undefined,
      end: undefined,
      timer: undefined,
      signal: undefined,
      resolve,
      reject,
    };
    this.#all.set(waiter.id, waiter);
    this.registry.set(waiter.id, (row) => this.on.granted(waiter, row));
    if (timeoutMs !== undefined && timeoutMs > 0) {
      waiter.timer = this.clock.setTimeout(() => {
        waiter.timer = undefined;
        this.on.end(waiter, { error: this.timeoutOf(waiter), deadline: true });
      }, timeoutMs);
    }
    const signal = request.signal;
    if (signal) {
      this.#aborts.watch(signal, waiter);
      waiter.signal = signal;
    }
    return { waiter, promise };
  }

  /** Stops the deadline timer and the abort listener. */
  clearResources(waiter: LocalWaiter): void {
    if (waiter.timer !== undefined) this.clock.clearTimeout(waiter.timer);
    waiter.timer = undefined;
    if (waiter.signal !== undefined) this.#aborts.unwatch(waiter.signal, waiter);
    waiter.signal = undefined;
  }

  /** Done: a grant that still comes for it is given back by whoever delivers it. */
  finish(waiter: LocalWaiter): void {
    waiter.state = 'done';
    this.clearResources(waiter);
    this.#all.delete(waiter.id);
    this.registry.delete(waiter.id);
  }

  settle(waiter: LocalWaiter, error: unknown): void {
    this.finish(waiter);
    waiter.reject(error);
  }

  /** Its timeout error, with the wait measured on the limiter's clock. */
  timeoutOf(waiter: LocalWaiter) {
    const waited = this.clock.now() - waiter.startedAt;
    return this.errors.timeout(waiter.workload, waiter.request, waited, waiter.timeoutMs ?? 0);
  }

  /**
   * Rejects every request still here, as the limiter failed with `cause`; a caller that had
   * already given up gets its own reason. Returns their ids, whose queue entries remain.
   */
  failAll(cause: unknown): string[] {
    const ended = this.list();
    for (const waiter of ended) {
      const end = waiter.end;
      const error =
        end && !end.deadline ? end.error : this.errors.failure(cause, waiter.workload, waiter.request);
      this.settle(waiter, error);
    }
    return ended.map((w) => w.id);
  }
}
