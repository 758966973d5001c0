import {
  limiterErrors,
  prepareAcquire,
  resolveWorkload,
  type AcquireRequest,
  type Clock,
  type ConcurrencyEventListener,
  type ConcurrencyLease,
  type ConcurrencyLimiter,
  type ConcurrencyStats,
  type LimiterErrors,
  type ReleaseDetails,
  type ResolvedLimits,
} from 'sluice/concurrency';
import type { Database } from './database.js';
import { hubFor, type ListenHub, type OfferNotice } from './hub.js';
import {
  resolvePostgresLimiterOptions,
  type PostgresConcurrencyLimiterOptions,
  type PostgresSettings,
} from './options.js';
import { OutageWatch } from './outage.js';
import { PassRunner, type PassInput, type PassResult } from './pass-runner.js';
import { PollSchedule } from './poll-schedule.js';
import { extendLeases, leaseOf, readStats } from './leases.js';
import { newMetrics, type LimiterMetrics } from './metrics.js';
import { limiterQueries, type LeaseRow, type LimiterQueries } from './queries.js';
import { registerLimits } from './register.js';
import { ensureSchema } from './schema.js';
import { CapacityListeners, InFlight, WakeTimer } from './limiter-parts.js';
import { LocalWaiters, type LocalWaiter, type WaitEnd } from './waiters.js';

// One shared registry per hub: a pass may grant a slot to a waiter of another limiter
// object of this process with the same name and database.
const registries = new WeakMap<ListenHub, Map<string, (row: LeaseRow) => void>>();

/**
 * The limiter shared by every process that uses the same database and name. Allocation
 * uses the same `allocate` rules as the in-memory limiter, inside a short transaction on the
 * limiter's row lock; no transaction or connection is held while a request waits or runs.
 * Freed slots are handed to the next waiter at once: directly when it is in this process,
 * otherwise as a short-lived offer announced by NOTIFY. A batched poll per process keeps
 * queue entries alive and catches anything a notification missed.
 *
 * Local timers and stamps (wait deadlines, polls, the outage watch) use the `clock` option;
 * lease expiry and queue deadlines are decided in SQL, in database time.
 */
export class PostgresConcurrencyLimiter<W extends string = 'default'> implements ConcurrencyLimiter<W> {
  readonly name: string;
  readonly limits: ResolvedLimits<W>;
  readonly settings: PostgresSettings;
  /** What this limiter object did: see {@link LimiterMetrics}. */
  readonly metrics: LimiterMetrics = newMetrics();

  readonly #db: Database;
  readonly #clock: Clock;
  readonly #errors: LimiterErrors;
  readonly #q: LimiterQueries;
  readonly #hub: ListenHub;
  readonly #registry: Map<string, (row: LeaseRow) => void>;
  readonly #waiters: LocalWaiters;
  readonly #outage: OutageWatch;
  readonly #passes: PassRunner;
  readonly #polls: PollSchedule;
  #ready: Promise<void> | undefined;
  #closed = false;
  readonly #listeners: CapacityListeners;
  /** A pass at the moment a waiting request fits a refilled budget or the pause ends. */
  readonly #wake: WakeTimer;
  #closing: Promise<void> | undefined;
  /** Database work under way: close() waits for all of it. */
  readonly #inFlight = new InFlight();

  constructor(options: PostgresConcurrencyLimiterOptions<W>) {
    const resolved = resolvePostgresLimiterOptions(options);
    this.limits = resolved.limits;
    this.name = this.limits.name;
    this.settings = resolved.settings;
    this.#db = resolved.database;
    this.#clock = resolved.clock;
    this.#errors = limiterErrors(this.limits);
    this.#q = limiterQueries(this.settings.schema);
    this.#listeners = new CapacityListeners(this.name, this.#clock);
    this.#wake = new WakeTimer(this.#clock, () => {
      if (!this.#closed) void this.#track(this.#submit({})).catch(() => undefined);
    });
    this.#outage = new OutageWatch(this.#clock, this.settings.outageGraceMs, (cause) =>
      this.#onOutage(cause),
    );
    this.#hub = hubFor(resolved.db, this.#db);
    this.#passes = new PassRunner({
      db: this.#db,
      queries: this.#q,
      name: this.name,
      owner: this.#hub.owner,
      settings: this.settings,
      maxConcurrent: this.limits.maxConcurrent,
      leaseTtlMs: this.limits.leaseTtlMs,
      clock: this.#clock,
      outage: this.#outage,
      metrics: this.metrics,
      deliver: (row) => this.#deliver(row),
    });
    this.#polls = new PollSchedule(
      this.#clock,
      () => this.#track(this.#heartbeat()),
      () => ({
        // While the database fails, look again soon: the request ends in a moment either way.
        intervalMs:
          !this.#hub.listening || this.#outage.failure !== undefined
            ? this.settings.pollIntervalMs
            : this.settings.fallbackPollIntervalMs,
        nextExpiryAt: this.#passes.nextExpiryAt,
        due: !this.#closed && this.#waiters.size > 0,
      }),
    );
    let registry = registries.get(this.#hub);
    if (!registry) registries.set(this.#hub, (registry = new Map()));
    this.#registry = registry;
    this.#waiters = new LocalWaiters(this.#clock, this.#errors, registry, {
      granted: (waiter, row) => this.#granted(waiter, row),
      end: (waiter, end) => this.#end(waiter, end),
    });
    this.#hub.join(this);
  }

  validateWorkload(workload?: string): W {
    return resolveWorkload(this.limits, workload).name;
  }

  maxWaitMs(workload?: string): number | undefined {
    return resolveWorkload(this.limits, workload).maxWaitMs;
  }

  /** Creates or upgrades the tables if needed and stores or checks the limits. Runs once; acquire calls it. */
  ready(): Promise<void> {
    this.#ready ??= this.#track(this.#outage.watch(() => this.#prepare())).catch((error: unknown) => {
      this.#ready = undefined;
      throw error;
    });
    return this.#ready;
  }

  async #prepare(): Promise<void> {
    if (this.settings.ensureSchema) await ensureSchema(this.#db, this.settings.schema);
    await registerLimits(this.#db, this.#q, this.limits, this.settings.onConflict);
  }

  acquire(request: AcquireRequest<W> = {}): Promise<ConcurrencyLease<W>> {
    const prepared = prepareAcquire(this.limits, request);
    if (!prepared.ok) return Promise.reject(prepared.error);
    const workload = prepared.workload.name;
    if (this.#closed) {
      return Promise.reject(this.#errors.failure(new Error('the limiter is closed'), workload, request));
    }
    const { waiter, promise } = this.#waiters.add(
      request,
      workload,
      prepared.key,
      prepared.timeoutMs,
      prepared.tokens,
    );
    void this.#track(this.#start(waiter));
    return promise as Promise<ConcurrencyLease<W>>;
  }

  async #start(waiter: LocalWaiter): Promise<void> {
    try {
      await this.ready();
    } catch (error) {
      if (waiter.state === 'starting') {
        this.#waiters.settle(waiter, this.#errors.failure(error, waiter.workload, waiter.request));
      }
      return;
    }
    if (waiter.state !== 'starting') return;
    waiter.state = 'waiting';
    if (this.settings.listen) void this.#hub.ensureListening();
    await this.#enqueue(waiter);
  }

  /** Puts the waiter in the queue (again, if its entry was lost) and handles the immediate answer. */
  async #enqueue(waiter: LocalWaiter): Promise<void> {
    // What is left of its wait: a request enqueued again does not start its wait over.
    const timeoutMs =
      waiter.timeoutMs === undefined
        ? undefined
        : Math.max(0, waiter.timeoutMs - (this.#clock.now() - waiter.startedAt));
    const pass = this.#submit({
      enqueue: {
        id: waiter.id,
        workload: waiter.workload,
        key: waiter.key,
        timeoutMs,
        tokens: waiter.tokens,
      },
    });
    waiter.enqueued = pass;
    let result: PassResult;
    try {
      result = await pass;
    } catch (error) {
      if (waiter.state === 'waiting') {
        this.#waiters.settle(waiter, this.#errors.failure(error, waiter.workload, waiter.request));
      }
      return;
    }
    // Granted (delivered as the pass committed), claiming an offer, leaving, or ended.
    if (waiter.state !== 'waiting') return;
    const outcome = result.outcome!;
    switch (outcome.kind) {
      case 'granted':
        return;
      case 'waiting':
        this.#polls.arm();
        return;
      case 'queue-full': {
        // The stored limits decided; their maxQueued is the one to report.
        const errors = limiterErrors({ name: this.name, maxQueued: outcome.maxQueued });
        this.#waiters.settle(waiter, errors.queueFull(waiter.workload, waiter.request, outcome.queued));
        return;
      }
      case 'timed-out':
        this.#waiters.settle(waiter, this.#waiters.timeoutOf(waiter));
        return;
      default: {
        const unknown: never = outcome;
        throw new Error(`unhandled enqueue outcome ${JSON.stringify(unknown)}`);
      }
    }
  }

  /** A slot for a local waiter: resolve it, or give the slot back if the waiter has gone. */
  #granted(waiter: LocalWaiter, row: LeaseRow): void {
    const lease = leaseOf(this.name, row);
    if ((waiter.state === 'waiting' || waiter.state === 'claiming') && waiter.end === undefined) {
      this.#waiters.finish(waiter);
      waiter.resolve(lease);
      return;
    }
    void this.release(lease).catch(() => undefined);
    if (waiter.state === 'claiming') this.#waiters.settle(waiter, waiter.end!.error);
  }

  /** Cancellation or the deadline has come. */
  #end(waiter: LocalWaiter, end: WaitEnd): void {
    switch (waiter.state) {
      case 'starting':
        // Nothing of it is in the database yet.
        this.#waiters.settle(waiter, end.error);
        return;
      case 'claiming':
        // The claim's answer settles it.
        waiter.end ??= end;
        return;
      case 'waiting':
        waiter.end = end;
        this.#leave(waiter, end);
        return;
      case 'leaving':
      case 'done':
        return;
      default: {
        const unknown: never = waiter.state;
        throw new Error(`unhandled waiter state ${String(unknown)}`);
      }
    }
  }

  /** Takes the waiter out of the queue, then rejects it. */
  #leave(waiter: LocalWaiter, end: WaitEnd): void {
    waiter.state = 'leaving';
    this.#waiters.clearResources(waiter);
    const failing = this.#outage.failure;
    if (end.deadline && failing) {
      // The deadline comes while the database is failing: the request fails as the limiter
      // did, now. Its entry is withdrawn when the database answers again, or lapses.
      this.#waiters.settle(waiter, this.#errors.failure(failing.error, waiter.workload, waiter.request));
      this.#withdraw([waiter.id]);
      return;
    }
    void this.#track(this.#withdrawAndSettle(waiter, end));
  }

  /** The second half of leaving: the queue entry goes, then the request is rejected. */
  async #withdrawAndSettle(waiter: LocalWaiter, end: WaitEnd): Promise<void> {
    await waiter.enqueued?.catch(() => undefined);
    let failure: { error: unknown } | undefined;
    try {
      await this.#submit({ cancel: waiter.id });
    } catch (error) {
      failure = { error };
    }
    if (waiter.state !== 'leaving') return; // an outage ended it meanwhile
    // A caller that gave up gets its own reason; a deadline that could not be honoured in
    // the database is a failure of the limiter.
    const error =
      failure && end.deadline
        ? this.#errors.failure(failure.error, waiter.workload, waiter.request)
        : end.error;
    this.#waiters.settle(waiter, error);
  }

  /** Removes queue entries (and offers to them) in the background; what fails lapses. */
  #withdraw(ids: string[]): void {
    for (const id of ids) void this.#track(this.#submit({ cancel: id })).catch(() => undefined);
  }

  /**
   * The database has not answered for `outageGraceMs`: every request still waiting here
   * fails closed. A caller that had already given up still gets its own reason.
   */
  #onOutage(cause: unknown): void {
    this.#withdraw(this.#waiters.failAll(cause));
  }

  /** Offers announced by NOTIFY: claim them all in one statement. */
  onOffers(notices: OfferNotice[]): void {
    const claiming: LocalWaiter[] = [];
    const ids: string[] = [];
    for (const notice of notices) {
      const waiter = this.#waiters.get(notice.w);
      if (waiter?.state !== 'waiting') continue;
      waiter.state = 'claiming';
      claiming.push(waiter);
      ids.push(notice.id);
    }
    if (ids.length === 0) return;
    void this.#track(this.#claim(ids, claiming));
  }

  async #claim(leaseIds: string[], waiters: LocalWaiter[]): Promise<void> {
    let rows: LeaseRow[] = [];
    try {
      rows = await this.#outage.watch(() =>
        extendLeases(this.#db, this.#q.claim, [leaseIds, this.limits.leaseTtlMs]),
      );
      this.metrics.offersClaimedOnNotify += rows.length;
    } catch {
      // Claiming failed; the next poll claims what is still on offer.
    }
    for (const row of rows) this.#deliver(row);
    for (const waiter of waiters) {
      if (waiter.state !== 'claiming') continue;
      // The offer lapsed before it could be claimed; the queue entry went with the offer.
      waiter.state = 'waiting';
      if (waiter.end !== undefined) {
        this.#waiters.settle(waiter, waiter.end.error);
      } else {
        this.metrics.requeued++;
        void this.#track(this.#enqueue(waiter));
      }
    }
  }

  onListenChange(listening: boolean): void {
    this.#polls.cancel();
    // Just reconnected: look at once for what may have been missed.
    if (listening && this.#waiters.size > 0) void this.#polls.now();
    else this.#polls.arm();
  }

  /** How waiting requests of this process learn of freed slots: NOTIFY wake-ups, or polling alone. */
  get wakeups(): 'notify' | 'polling' {
    return this.#hub.listening ? 'notify' : 'polling';
  }

  /** The batched poll: keeps this process's queue entries alive and claims offers to them. */
  async #heartbeat(): Promise<void> {
    if (this.#closed) return;
    // Looked at now; a pass that succeeds tells the next expiry (a failed one must not leave
    // the schedule spinning on a time in the past).
    if (this.#passes.nextExpiryAt <= this.#clock.now()) this.#passes.nextExpiryAt = Infinity;
    try {
      const waiting = this.#waiters.list().filter((w) => w.state === 'waiting');
      await Promise.all(waiting.map((w) => w.enqueued?.catch(() => undefined)));
      const ids = waiting.filter((w) => w.state === 'waiting').map((w) => w.id);
      if (ids.length === 0) return;
      this.metrics.polls++;
      const { present } = await this.#submit({ heartbeat: ids });
      const now = this.#clock.now();
      for (const id of ids) {
        const waiter = this.#waiters.get(id);
        if (waiter?.state !== 'waiting' || present?.has(id)) continue;
        // The entry is gone without a grant: its deadline passed in database time just before
        // the local timer, an offer to it lapsed unclaimed, or it was dropped while this process
        // sent no heartbeat for queueEntryTtlMs. It goes back in the queue for what is left of
        // its wait; with none left, its deadline has come.
        if (waiter.timeoutMs !== undefined && now - waiter.startedAt >= waiter.timeoutMs) {
          this.#end(waiter, { error: this.#waiters.timeoutOf(waiter), deadline: true });
        } else {
          this.metrics.requeued++;
          void this.#track(this.#enqueue(waiter));
        }
      }
    } catch {
      // The outage watch counts it: waiting requests fail if the database stays away.
    }
  }

  #deliver(row: LeaseRow): void {
    const deliver = this.#registry.get(row.waiter_id ?? '');
    if (deliver) deliver(row);
    else void this.release(leaseOf(this.name, row)).catch(() => undefined);
  }

  renew(lease: ConcurrencyLease<W>): Promise<ConcurrencyLease<W> | undefined> {
    return this.#track(this.#renew(lease));
  }

  async #renew(lease: ConcurrencyLease<W>): Promise<ConcurrencyLease<W> | undefined> {
    try {
      const row = (await extendLeases(this.#db, this.#q.renew, [lease.id, this.limits.leaseTtlMs]))[0];
      return row ? (leaseOf(this.name, row) as ConcurrencyLease<W>) : undefined;
    } catch (error) {
      throw this.#errors.failure(error, lease.workload, {});
    }
  }

  /**
   * Gives the slot back. `details` settles the grant's tokens to the usage and reports the
   * provider's answer, in the same pass: a pause or a lowered limit holds for every process
   * from the next grant on, since every grant is decided under the limiter's row lock.
   */
  release(lease: ConcurrencyLease<W> | ConcurrencyLease<string>, details?: ReleaseDetails): Promise<void> {
    return this.#track(this.#release(lease, details));
  }

  async #release(
    lease: ConcurrencyLease<W> | ConcurrencyLease<string>,
    details: ReleaseDetails | undefined,
  ): Promise<void> {
    let result: PassResult;
    try {
      await this.ready();
      result = await this.#submit({
        release: lease.id,
        ...(details !== undefined && { releaseDetails: { fence: lease.fence, details } }),
      });
    } catch (error) {
      throw this.#errors.failure(error, lease.workload, {});
    }
    if (result.released) this.#listeners.announce(result.released, lease.workload);
  }

  stats(): Promise<ConcurrencyStats<W>> {
    return this.#track(
      this.ready().then(() => readStats(this.#db, this.#q, this.limits, this.settings.queueEntryTtlMs)),
    );
  }

  /**
   * Hears this limiter object's events: `provider-throttled` and `limit-changed` for the
   * releases made through it (the pause and the limit themselves hold for every process).
   */
  subscribe(listener: ConcurrencyEventListener): () => void {
    return this.#listeners.subscribe(listener);
  }

  /** Runs a pass, then looks again when the pass says a waiting request may fit. */
  async #submit(input: PassInput): Promise<PassResult> {
    const result = await this.#passes.submit(input);
    this.#armWake();
    return result;
  }

  /** An empty pass at the moment the pass says a waiting request may fit: it grants (and offers to other processes) whatever fits then. */
  #armWake(): void {
    this.#wake.arm(this.#closed ? Infinity : this.#passes.wakeAt);
  }

  /**
   * Fails the requests still waiting (their queue entries are withdrawn), stops polling, and
   * resolves once nothing of this limiter is left: no statement in flight, no timer on its
   * clock, and (for the last limiter of its pool) no LISTEN session. The pool is the caller's:
   * end it after this. Calling it again returns the same promise.
   */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#closed = true;
    this.#polls.cancel();
    this.#wake.clear();
    for (const waiter of this.#waiters.list()) {
      const error = this.#errors.failure(
        new Error('the limiter was closed'),
        waiter.workload,
        waiter.request,
      );
      this.#end(waiter, { error, deadline: false });
    }
    await Promise.all([this.#inFlight.settled(), this.#hub.leave(this)]);
    // A failed statement leaves the outage watch running until its grace ends.
    this.#outage.stop();
  }

  /** Keeps `work` where close() can wait for it. */
  #track<T>(work: Promise<T>): Promise<T> {
    return this.#inFlight.track(work);
  }
}

/**
 * Creates a limiter whose slots are shared by every process that uses the same database,
 * schema and name.
 *
 * @example
 * const claude = createPostgresConcurrencyLimiter({
 *   db: new pg.Pool({ connectionString: process.env.DATABASE_URL }),
 *   name: 'claude',
 *   maxConcurrent: 8,
 *   workloads: { interactive: { reserved: 2, priority: 10 }, background: { maxConcurrent: 6 } },
 * });
 */
export function createPostgresConcurrencyLimiter<W extends string = 'default'>(
  options: PostgresConcurrencyLimiterOptions<W>,
): PostgresConcurrencyLimiter<W> {
  return new PostgresConcurrencyLimiter(options);
}
