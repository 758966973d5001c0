import { AbortWatch } from './abort-watch.js';
import { systemClock, type Clock, type ClockTimer } from './clock.js';
import {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLeaseLostError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  lineageOf,
  type RequestLineage,
} from './errors.js';
import type { ReleaseDetails, TokenCounts } from './capacity-types.js';
import type { ConcurrencyEvent, ConcurrencyEventListener, ReleaseOutcome } from './events.js';
import type { ConcurrencyLease, ConcurrencyLimiter } from './limiter.js';
import { pauseOf, statusOf } from './capacity.js';

/** One provider request's claim on a limiter. */
export interface SlotRequest<W extends string = string> extends RequestLineage {
  readonly limiter: ConcurrencyLimiter<W>;
  readonly workload?: W | undefined;
  /** Fairness key of the request (see `AcquireRequest.key`). */
  readonly key?: string | undefined;
  /** Cancels the wait, or, once held, marks the slot's request as cancelled. */
  readonly signal?: AbortSignal | undefined;
  /**
   * What is left of the run's time budget. A wait it ends is a timeout (`timed-out` and
   * `ConcurrencyTimeoutError`), decided here on `clock`, whether or not the limiter's own timer
   * gets there first. Pass a `signal` that only cancels; the budget goes here.
   */
  readonly timeoutMs?: number | undefined;
  readonly onEvent?: ConcurrencyEventListener | undefined;
  readonly clock?: Clock | undefined;
  /** The request's estimated tokens, charged to the limiter's token budgets (see `AcquireRequest.tokens`). */
  readonly tokens?: TokenCounts | undefined;
}

/** A slot held for one provider request. */
export interface HeldSlot<W extends string = string> {
  /** The current lease (replaced at each renewal). */
  readonly lease: ConcurrencyLease<W>;
  /**
   * Aborted with `ConcurrencyLeaseLostError` when the lease could not be kept: pass it to the
   * provider request so the request stops with the slot.
   */
  readonly signal: AbortSignal;
  /**
   * Gives the slot back. Idempotent; never rejects (a failure becomes a `release-failed` event).
   * `details` goes to the limiter's `release`: the tokens the request used, and what the
   * provider said, which emits `provider-throttled` when the provider is overloaded.
   */
  release(outcome?: ReleaseOutcome, details?: ReleaseDetails): Promise<void>;
}

/** Lifecycle of a held slot:  held -> released  |  held -> lost -> released (no event). */
type SlotState = 'held' | 'lost' | 'released';

/**
 * Takes a slot for one provider request and keeps it: emits the wait and grant events,
 * renews the lease while the request runs (every third of its TTL), aborts `slot.signal`
 * when the lease is lost, and turns every failure into the spec's error classes. A slot
 * granted at the moment of cancellation is handed straight back.
 *
 * This is the one place that decides a wait timed out: a budget (`timeoutMs`) that ends
 * during the wait always gives `timed-out` and `ConcurrencyTimeoutError`, never
 * `wait-cancelled`, whichever of the limiter's timer and this function's fires first.
 *
 * @example
 * const slot = await acquireSlot({ limiter, workload: 'interactive', signal, timeoutMs });
 * try {
 *   await callProvider({ signal: AbortSignal.any([signal, slot.signal]) });
 *   await slot.release('completed');
 * } catch (error) {
 *   await slot.release(signal.aborted ? 'cancelled' : 'failed');
 *   throw error;
 * }
 */
export async function acquireSlot<W extends string>(request: SlotRequest<W>): Promise<HeldSlot<W>> {
  const { limiter, signal } = request;
  const clock = request.clock ?? systemClock;
  const lineage = lineageOf(request);
  let workload: string = request.workload ?? 'default';
  const emit = (event: { type: ConcurrencyEvent['type'] } & Record<string, unknown>): void => {
    if (!request.onEvent) return;
    try {
      request.onEvent({
        limiter: limiter.name,
        workload,
        ...lineage,
        at: clock.now(),
        ...event,
      } as ConcurrencyEvent);
    } catch {
      // A listener must not be able to break the slot lifecycle.
    }
  };

  if (limiter.validateWorkload) {
    try {
      workload = limiter.validateWorkload(request.workload);
    } catch (error) {
      const failure = toConcurrencyError(error, limiter.name, workload, lineage);
      emit({ type: 'config-error', error: failure });
      throw failure;
    }
  }

  const startedAt = clock.now();
  if (request.timeoutMs !== undefined && request.timeoutMs <= 0) {
    // The run's budget is spent: no limiter call, no provider call.
    const failure = new ConcurrencyTimeoutError({
      limiter: limiter.name,
      workload,
      ...lineage,
      waitMs: 0,
      timeoutMs: 0,
    });
    emit({ type: 'timed-out', waitMs: 0 });
    throw failure;
  }
  emit({ type: 'wait-started', deadline: waitDeadline(limiter, workload, startedAt, request.timeoutMs) });
  const budgetEnded = (): ConcurrencyTimeoutError => {
    const waitMs = clock.now() - startedAt;
    emit({ type: 'timed-out', waitMs });
    return new ConcurrencyTimeoutError({
      limiter: limiter.name,
      workload,
      ...lineage,
      waitMs,
      timeoutMs: request.timeoutMs ?? 0,
    });
  };

  const wait = new BudgetedWait(signal, request.timeoutMs, clock);
  let lease: ConcurrencyLease<W>;
  try {
    lease = await limiter.acquire({
      workload: request.workload,
      key: request.key,
      signal: wait.signal,
      timeoutMs: request.timeoutMs,
      ...(request.tokens === undefined ? {} : { tokens: request.tokens }),
      ...lineage,
    });
  } catch (error) {
    const waitMs = clock.now() - startedAt;
    if (!(error instanceof ConcurrencyError)) {
      if (wait.budgetEnded) throw budgetEnded();
      if (signal?.aborted) {
        emit({ type: 'wait-cancelled', waitMs });
        throw signal.reason;
      }
    }
    const failure = toConcurrencyError(error, limiter.name, workload, lineage);
    if (failure instanceof ConcurrencyTimeoutError) emit({ type: 'timed-out', waitMs });
    else if (failure instanceof ConcurrencyQueueFullError) emit({ type: 'queue-full', waitMs });
    else if (failure instanceof ConcurrencyConfigError) emit({ type: 'config-error', error: failure });
    else emit({ type: 'limiter-error', waitMs, error: failure });
    throw failure;
  } finally {
    wait.dispose();
  }
  workload = lease.workload;

  // Granted at the same moment as the budget ended or the wait was cancelled: the slot goes
  // straight back.
  if (wait.budgetEnded || signal?.aborted) {
    const failure = wait.budgetEnded ? budgetEnded() : undefined;
    if (!failure) emit({ type: 'wait-cancelled', waitMs: clock.now() - startedAt });
    await limiter.release(lease).catch((error: unknown) => {
      emit({ type: 'release-failed', leaseId: lease.id, error: asError(error) });
    });
    throw failure ?? signal!.reason;
  }

  const acquiredAt = clock.now();
  emit({ type: 'acquired', leaseId: lease.id, waitMs: acquiredAt - startedAt });
  return new Slot(limiter, lease, acquiredAt, clock, emit, { ...lineage, workload });
}

class Slot<W extends string> implements HeldSlot<W> {
  #state: SlotState = 'held';
  #lease: ConcurrencyLease<W>;
  #timer: ClockTimer | undefined;
  #releasing: Promise<void> | undefined;
  #lastConfirmedAt: number;
  readonly #ttlMs: number;
  readonly #controller = new AbortController();

  constructor(
    readonly limiter: ConcurrencyLimiter<W>,
    lease: ConcurrencyLease<W>,
    readonly acquiredAt: number,
    readonly clock: Clock,
    readonly emit: (event: { type: ConcurrencyEvent['type'] } & Record<string, unknown>) => void,
    readonly context: RequestLineage & { workload: string },
  ) {
    this.#lease = lease;
    this.#lastConfirmedAt = acquiredAt;
    // Measured in the limiter's own clock, so clock skew between here and a database cannot
    // shorten or stretch it.
    this.#ttlMs = Math.max(1, lease.expiresAt - lease.acquiredAt);
    this.#schedule();
  }

  get lease(): ConcurrencyLease<W> {
    return this.#lease;
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  get #intervalMs(): number {
    return Math.max(1, Math.floor(this.#ttlMs / 3));
  }

  #schedule(): void {
    this.#timer = this.clock.setTimeout(() => void this.#renew(), this.#intervalMs, { background: true });
  }

  async #renew(): Promise<void> {
    this.#timer = undefined;
    if (this.#state !== 'held') return;
    let renewed: ConcurrencyLease<W> | undefined;
    try {
      renewed = await this.limiter.renew(this.#lease);
    } catch (error) {
      if (this.#state !== 'held') return;
      this.emit({ type: 'renewal-failed', leaseId: this.#lease.id, error: asError(error) });
      // The next attempt would come after the lease lapses: stop the request now, while the
      // slot is still ours, rather than run on without one.
      if (this.clock.now() + this.#intervalMs - this.#lastConfirmedAt >= this.#ttlMs) return this.#lose();
      return this.#schedule();
    }
    if (this.#state !== 'held') return;
    if (renewed === undefined) return this.#lose();
    this.#lease = renewed;
    this.#lastConfirmedAt = this.clock.now();
    this.#schedule();
  }

  #lose(): void {
    if (this.#state !== 'held') return;
    this.#state = 'lost';
    const holdMs = this.clock.now() - this.acquiredAt;
    this.emit({ type: 'lease-lost', leaseId: this.#lease.id, holdMs });
    this.#controller.abort(
      new ConcurrencyLeaseLostError({
        limiter: this.limiter.name,
        ...this.context,
        leaseId: this.#lease.id,
        holdMs,
      }),
    );
  }

  release(outcome: ReleaseOutcome = 'completed', details?: ReleaseDetails): Promise<void> {
    this.#releasing ??= this.#release(outcome, details);
    return this.#releasing;
  }

  async #release(outcome: ReleaseOutcome, details: ReleaseDetails | undefined): Promise<void> {
    const wasHeld = this.#state === 'held';
    this.#state = 'released';
    if (this.#timer !== undefined) this.clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    const lease = this.#lease;
    // The provider's word stands even for a lost lease: its account is overloaded either way.
    const pauseMs = pauseOf(details?.provider);
    if (pauseMs !== undefined) {
      this.emit({ type: 'provider-throttled', status: statusOf(details?.provider), retryAfterMs: pauseMs });
    }
    try {
      // A limiter that takes one argument still conforms: the details are extra.
      await (details === undefined ? this.limiter.release(lease) : this.limiter.release(lease, details));
    } catch (error) {
      this.emit({ type: 'release-failed', leaseId: lease.id, error: asError(error) });
      return;
    }
    if (wasHeld)
      this.emit({ type: 'released', leaseId: lease.id, holdMs: this.clock.now() - this.acquiredAt, outcome });
  }
}

function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error));
}

/**
 * The limiter's wait for one request: cancelled by the caller's signal, or ended by the
 * budget on this side's clock. Which of the two came first is recorded, so a budget that ends
 * is told apart from a cancellation without comparing times.
 */
class BudgetedWait {
  readonly #controller: AbortController | undefined;
  readonly #source: AbortSignal | undefined;
  readonly #clock: Clock;
  #timer: ClockTimer | undefined;
  #budgetEnded = false;

  constructor(source: AbortSignal | undefined, timeoutMs: number | undefined, clock: Clock) {
    this.#source = source;
    this.#clock = clock;
    // Without a budget the limiter gets the caller's signal as it is.
    if (timeoutMs === undefined) return;
    this.#controller = new AbortController();
    if (source?.aborted) this.#controller.abort(source.reason);
    else if (source) BudgetedWait.#cancels.watch(source, this);
    this.#timer = clock.setTimeout(() => {
      this.#timer = undefined;
      if (this.#controller!.signal.aborted) return;
      this.#budgetEnded = true;
      this.#controller!.abort(new Error(`the wait's budget of ${timeoutMs} ms ran out`));
    }, timeoutMs);
  }

  /**
   * The caller's signal cancels each wait on it: one listener per signal, however many slots
   * are asked for with it at once.
   */
  static readonly #cancels = new AbortWatch<BudgetedWait>((wait, reason) => wait.#controller!.abort(reason));

  /** What the limiter listens to. */
  get signal(): AbortSignal | undefined {
    return this.#controller?.signal ?? this.#source;
  }

  /** The budget ran out before any cancellation. */
  get budgetEnded(): boolean {
    return this.#budgetEnded;
  }

  dispose(): void {
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#source) BudgetedWait.#cancels.unwatch(this.#source, this);
  }
}

/**
 * `error` with the request's lineage filled in where it has none, as a copy of the same class:
 * an error a limiter threw (and may still hold) is never changed behind its back.
 */
export function withLineage<E extends ConcurrencyError>(error: E, lineage: RequestLineage): E {
  const missing = Object.entries(lineage).filter(
    ([key, value]) => value !== undefined && (error as unknown as Record<string, unknown>)[key] === undefined,
  );
  if (missing.length === 0) return error;
  const copy = Object.create(Object.getPrototypeOf(error), Object.getOwnPropertyDescriptors(error)) as E;
  for (const [key, value] of missing) {
    Object.defineProperty(copy, key, { value, writable: true, enumerable: true, configurable: true });
  }
  return copy;
}

/** Keeps the spec's error classes as they are (adding lineage); wraps anything else as a limiter failure. */
function toConcurrencyError(
  error: unknown,
  limiter: string,
  workload: string,
  lineage: RequestLineage,
): ConcurrencyError {
  if (error instanceof ConcurrencyError) return withLineage(error, lineage);
  const message = error instanceof Error ? error.message : String(error);
  return new ConcurrencyLimiterError(`Limiter \`${limiter}\` failed: ${message}`, {
    limiter,
    workload,
    ...lineage,
    cause: error,
  });
}

/**
 * When the wait will end at the latest: the run's budget or the workload's `maxWaitMs`,
 * whichever comes first (a limiter that cannot say its `maxWaitMs` leaves only the budget).
 */
function waitDeadline(
  limiter: ConcurrencyLimiter<string>,
  workload: string,
  startedAt: number,
  budgetMs: number | undefined,
): number | undefined {
  let maxWaitMs: number | undefined;
  try {
    maxWaitMs = limiter.maxWaitMs?.(workload);
  } catch {
    // A workload it refuses is refused by acquire too, with the error the caller expects.
  }
  const bounds = [budgetMs, maxWaitMs].filter((ms): ms is number => ms !== undefined);
  return bounds.length === 0 ? undefined : startedAt + Math.min(...bounds);
}
