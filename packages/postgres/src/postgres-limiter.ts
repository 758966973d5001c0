import { randomUUID } from 'node:crypto';
import {
  ConcurrencyConfigError,
  limiterErrors,
  prepareAcquire,
  resolveWorkload,
  statsOf,
  type AcquireRequest,
  type Clock,
  type ClockTimer,
  type ConcurrencyLease,
  type ConcurrencyLimiter,
  type ConcurrencyStats,
  type LimiterErrors,
  type ResolvedLimits,
} from 'sluice/concurrency';
import { Batcher } from './batcher.js';
import type { Database } from './database.js';
import { channelPrefix, hubFor, type ListenHub, type OfferNotice } from './hub.js';
import {
  resolvePostgresLimiterOptions,
  type PostgresConcurrencyLimiterOptions,
  type PostgresSettings,
} from './options.js';
import { OutageWatch } from './outage.js';
import { decodePass, planPass, type Enqueue, type EnqueueOutcome, type PassRow } from './pass.js';
import { limiterQueries, type LeaseRow, type LimiterQueries } from './queries.js';
import { ensureSchema } from './schema.js';
import { differences, storedForm, type StoredLimits } from './stored-limits.js';
import type { LocalWaiter, WaitEnd } from './waiter.js';

/** What one caller has to say to the limiter in a pass; a pass carries a batch of them. */
interface PassInput {
  enqueue?: Enqueue;
  release?: string;
  cancel?: string;
  /** Waiters of this limiter to keep alive, and whose pending offers to claim. */
  heartbeat?: string[];
}

interface PassResult {
  outcome: EnqueueOutcome | undefined;
  /** For a heartbeat: which of the waiters still have their queue entry. */
  present: ReadonlySet<string> | undefined;
}

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
  /**
   * What this limiter object did, for dashboards and tuning: allocation transactions (and
   * how many failed), and how slots reached its waiting requests (directly, by an offer
   * claimed after a NOTIFY or by a poll, or by enqueueing again after an offer lapsed or an
   * entry was lost).
   */
  readonly metrics = {
    passes: 0,
    failedPasses: 0,
    polls: 0,
    directGrants: 0,
    offersMade: 0,
    offersClaimedOnNotify: 0,
    offersClaimedOnPoll: 0,
    requeued: 0,
  };

  readonly #db: Database;
  readonly #clock: Clock;
  readonly #errors: LimiterErrors;
  readonly #q: LimiterQueries;
  readonly #hub: ListenHub;
  readonly #registry: Map<string, (row: LeaseRow) => void>;
  readonly #waiters = new Map<string, LocalWaiter>();
  readonly #outage: OutageWatch;
  /** At most one pass in flight per limiter object; what comes meanwhile goes into the next. */
  readonly #passes: Batcher<PassInput, PassResult>;
  #ready: Promise<void> | undefined;
  #pollTimer: ClockTimer | undefined;
  #pollAt = Infinity;
  #polling = false;
  /** When the next known lease lapses, on the local clock (from the last pass). */
  #nextExpiryAt = Infinity;
  #closed = false;

  constructor(options: PostgresConcurrencyLimiterOptions<W>) {
    const resolved = resolvePostgresLimiterOptions(options);
    this.limits = resolved.limits;
    this.name = this.limits.name;
    this.settings = resolved.settings;
    this.#db = resolved.database;
    this.#clock = resolved.clock;
    this.#errors = limiterErrors(this.limits);
    this.#q = limiterQueries(this.settings.schema);
    this.#outage = new OutageWatch(this.#clock, this.settings.outageGraceMs, (cause) =>
      this.#onOutage(cause),
    );
    this.#passes = new Batcher((inputs) => this.#watchedPass(inputs));
    this.#hub = hubFor(resolved.db, this.#db);
    let registry = registries.get(this.#hub);
    if (!registry) registries.set(this.#hub, (registry = new Map()));
    this.#registry = registry;
    this.#hub.join(this);
  }

  validateWorkload(workload?: string): W {
    return resolveWorkload(this.limits, workload).name;
  }

  /** Creates or upgrades the tables if needed and stores or checks the limits. Runs once; acquire calls it. */
  ready(): Promise<void> {
    this.#ready ??= this.#outage
      .watch(() => this.#prepare())
      .catch((error: unknown) => {
        this.#ready = undefined;
        throw error;
      });
    return this.#ready;
  }

  async #prepare(): Promise<void> {
    if (this.settings.ensureSchema) await ensureSchema(this.#db, this.settings.schema);
    const mine = storedForm(this.limits);
    await this.#db.query(this.#q.registerLimits, [this.name, JSON.stringify(mine)]);
    const row = (await this.#db.query<{ limits: StoredLimits }>(this.#q.readLimits, [this.name])).rows[0];
    const diff = row ? differences(mine, row.limits) : [];
    if (diff.length === 0) return;
    if (this.settings.onConflict === 'replace') {
      await this.#db.query(this.#q.replaceLimits, [this.name, JSON.stringify(mine)]);
      return;
    }
    throw new ConcurrencyConfigError(
      `Limiter \`${this.name}\` is stored with other limits: ${diff.join('; ')}. ` +
        "Every worker sharing a name must use the same limits; use a new name, or onConflict: 'replace'",
      { limiter: this.name, field: 'limits', value: row?.limits },
    );
  }

  acquire(request: AcquireRequest<W> = {}): Promise<ConcurrencyLease<W>> {
    const prepared = prepareAcquire(this.limits, request);
    if (!prepared.ok) return Promise.reject(prepared.error);
    const workload = prepared.workload.name;
    if (this.#closed) {
      return Promise.reject(this.#errors.failure(new Error('the limiter is closed'), workload, request));
    }
    let resolve!: (lease: ConcurrencyLease<string>) => void;
    let reject!: (error: unknown) => void;
    const promise = new Promise<ConcurrencyLease<string>>((res, rej) => ((resolve = res), (reject = rej)));
    const waiter: LocalWaiter = {
      id: randomUUID(),
      workload,
      request,
      startedAt: this.#clock.now(),
      timeoutMs: prepared.timeoutMs,
      state: 'starting',
      enqueued: undefined,
      end: undefined,
      timer: undefined,
      onAbort: undefined,
      resolve,
      reject,
    };
    this.#waiters.set(waiter.id, waiter);
    this.#registry.set(waiter.id, (row) => this.#granted(waiter, row));
    // The deadline counts from the request's arrival. A wait of 0 takes a free slot or none:
    // the enqueue pass decides that, without a timer.
    if (waiter.timeoutMs !== undefined && waiter.timeoutMs > 0) {
      waiter.timer = this.#clock.setTimeout(() => {
        waiter.timer = undefined;
        this.#end(waiter, { error: this.#timeoutOf(waiter), deadline: true });
      }, waiter.timeoutMs);
    }
    const signal = request.signal;
    if (signal) {
      waiter.onAbort = () => this.#end(waiter, { error: signal.reason, deadline: false });
      signal.addEventListener('abort', waiter.onAbort, { once: true });
    }
    void this.#start(waiter);
    return promise as Promise<ConcurrencyLease<W>>;
  }

  async #start(waiter: LocalWaiter): Promise<void> {
    try {
      await this.ready();
    } catch (error) {
      if (waiter.state === 'starting') {
        this.#settle(waiter, this.#errors.failure(error, waiter.workload, waiter.request));
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
    const pass = this.#passes.submit({ enqueue: { id: waiter.id, workload: waiter.workload, timeoutMs } });
    waiter.enqueued = pass;
    let result: PassResult;
    try {
      result = await pass;
    } catch (error) {
      if (waiter.state === 'waiting') {
        this.#settle(waiter, this.#errors.failure(error, waiter.workload, waiter.request));
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
        this.#schedulePoll();
        return;
      case 'queue-full': {
        // The stored limits decided; their maxQueued is the one to report.
        const errors = limiterErrors({ name: this.name, maxQueued: outcome.maxQueued });
        this.#settle(waiter, errors.queueFull(waiter.workload, waiter.request, outcome.queued));
        return;
      }
      case 'timed-out':
        this.#settle(waiter, this.#timeoutOf(waiter));
        return;
      default: {
        const unknown: never = outcome;
        throw new Error(`unhandled enqueue outcome ${JSON.stringify(unknown)}`);
      }
    }
  }

  /** A slot for a local waiter: resolve it, or give the slot back if the waiter has gone. */
  #granted(waiter: LocalWaiter, row: LeaseRow): void {
    const lease = this.#lease(row);
    if ((waiter.state === 'waiting' || waiter.state === 'claiming') && waiter.end === undefined) {
      this.#finish(waiter);
      waiter.resolve(lease);
      return;
    }
    void this.release(lease).catch(() => undefined);
    if (waiter.state === 'claiming') this.#settle(waiter, waiter.end!.error);
  }

  /** Cancellation or the deadline has come. */
  #end(waiter: LocalWaiter, end: WaitEnd): void {
    switch (waiter.state) {
      case 'starting':
        // Nothing of it is in the database yet.
        this.#settle(waiter, end.error);
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
    this.#clearWaitResources(waiter);
    const failing = this.#outage.failure;
    if (end.deadline && failing) {
      // The deadline comes while the database is failing: the request fails as the limiter
      // did, now. Its entry is withdrawn when the database answers again, or lapses.
      this.#settle(waiter, this.#errors.failure(failing.error, waiter.workload, waiter.request));
      this.#withdraw([waiter.id]);
      return;
    }
    void (async () => {
      await waiter.enqueued?.catch(() => undefined);
      let failure: { error: unknown } | undefined;
      try {
        await this.#passes.submit({ cancel: waiter.id });
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
      this.#settle(waiter, error);
    })();
  }

  /** Removes queue entries (and offers to them) in the background; what fails lapses. */
  #withdraw(ids: string[]): void {
    for (const id of ids) void this.#passes.submit({ cancel: id }).catch(() => undefined);
  }

  #clearWaitResources(waiter: LocalWaiter): void {
    if (waiter.timer !== undefined) this.#clock.clearTimeout(waiter.timer);
    waiter.timer = undefined;
    if (waiter.onAbort) waiter.request.signal?.removeEventListener('abort', waiter.onAbort);
    waiter.onAbort = undefined;
  }

  #finish(waiter: LocalWaiter): void {
    waiter.state = 'done';
    this.#clearWaitResources(waiter);
    this.#waiters.delete(waiter.id);
    this.#registry.delete(waiter.id);
  }

  #settle(waiter: LocalWaiter, error: unknown): void {
    this.#finish(waiter);
    waiter.reject(error);
  }

  #timeoutOf(waiter: LocalWaiter) {
    const waited = this.#clock.now() - waiter.startedAt;
    return this.#errors.timeout(waiter.workload, waiter.request, waited, waiter.timeoutMs ?? 0);
  }

  /**
   * The database has not answered for `outageGraceMs`: every request still waiting here
   * fails closed. A caller that had already given up still gets its own reason.
   */
  #onOutage(cause: unknown): void {
    const ended = [...this.#waiters.values()];
    for (const waiter of ended) {
      const end = waiter.end;
      const error =
        end && !end.deadline ? end.error : this.#errors.failure(cause, waiter.workload, waiter.request);
      this.#settle(waiter, error);
    }
    this.#withdraw(ended.map((w) => w.id));
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
    void this.#claim(ids, claiming);
  }

  async #claim(leaseIds: string[], waiters: LocalWaiter[]): Promise<void> {
    let rows: LeaseRow[] = [];
    try {
      rows = await this.#outage.watch(() => this.#extend(this.#q.claim, [leaseIds, this.limits.leaseTtlMs]));
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
        this.#settle(waiter, waiter.end.error);
      } else {
        this.metrics.requeued++;
        void this.#enqueue(waiter);
      }
    }
  }

  onListenChange(listening: boolean): void {
    this.#cancelPoll();
    // Just reconnected: look at once for what may have been missed.
    if (listening && this.#waiters.size > 0) void this.#poll();
    else this.#schedulePoll();
  }

  /** How waiting requests of this process learn of freed slots: NOTIFY wake-ups, or polling alone. */
  get wakeups(): 'notify' | 'polling' {
    return this.#hub.listening ? 'notify' : 'polling';
  }

  #schedulePoll(): void {
    if (this.#closed || this.#waiters.size === 0) return;
    // While the database fails, look again soon: the request ends in a moment either way.
    const fast = !this.#hub.listening || this.#outage.failure !== undefined;
    const interval = fast ? this.settings.pollIntervalMs : this.settings.fallbackPollIntervalMs;
    const now = this.#clock.now();
    // Look again at the routine interval, or when the next lease lapses if sooner. No margin
    // is added: a poll that comes a moment early finds the lease still held and learns the
    // exact time left from the database, then looks again.
    const at = Math.min(now + interval, this.#nextExpiryAt);
    if (this.#pollTimer !== undefined && this.#pollAt <= at) return;
    this.#cancelPoll();
    this.#pollAt = at;
    this.#pollTimer = this.#clock.setTimeout(() => {
      this.#pollTimer = undefined;
      this.#pollAt = Infinity;
      // Looked at now; a pass that succeeds tells the next one (a failed one must not make
      // the poll spin on a time in the past).
      if (this.#nextExpiryAt <= this.#clock.now()) this.#nextExpiryAt = Infinity;
      void this.#poll();
    }, at - now);
  }

  #cancelPoll(): void {
    if (this.#pollTimer !== undefined) this.#clock.clearTimeout(this.#pollTimer);
    this.#pollTimer = undefined;
    this.#pollAt = Infinity;
  }

  async #poll(): Promise<void> {
    if (this.#polling || this.#closed) return;
    this.#polling = true;
    try {
      const waiting = [...this.#waiters.values()].filter((w) => w.state === 'waiting');
      await Promise.all(waiting.map((w) => w.enqueued?.catch(() => undefined)));
      const ids = waiting.filter((w) => w.state === 'waiting').map((w) => w.id);
      if (ids.length === 0) return;
      this.metrics.polls++;
      const { present } = await this.#passes.submit({ heartbeat: ids });
      const now = this.#clock.now();
      for (const id of ids) {
        const waiter = this.#waiters.get(id);
        if (waiter?.state !== 'waiting' || present?.has(id)) continue;
        // The entry is gone without a grant: its deadline passed in database time just before
        // the local timer, an offer to it lapsed unclaimed, or it was dropped while this process
        // sent no heartbeat for queueEntryTtlMs. It goes back in the queue for what is left of
        // its wait; with none left, its deadline has come.
        if (waiter.timeoutMs !== undefined && now - waiter.startedAt >= waiter.timeoutMs) {
          this.#end(waiter, { error: this.#timeoutOf(waiter), deadline: true });
        } else {
          this.metrics.requeued++;
          void this.#enqueue(waiter);
        }
      }
    } catch {
      // The outage watch counts it: waiting requests fail if the database stays away.
    } finally {
      this.#polling = false;
      this.#schedulePoll();
    }
  }

  async #watchedPass(inputs: PassInput[]): Promise<PassResult[]> {
    try {
      return await this.#outage.watch(() => this.#runPass(inputs));
    } catch (error) {
      this.metrics.failedPasses++;
      throw error;
    }
  }

  /** One allocation: a short transaction on the limiter's row lock, for a batch of changes. */
  async #runPass(inputs: PassInput[]): Promise<PassResult[]> {
    const q = this.#q;
    const owner = this.#hub.owner;
    const enqueues = inputs.flatMap((i) => (i.enqueue ? [i.enqueue] : []));
    const { grants, state, plan } = await this.#db.transaction(
      async (tx) => {
        const rows = (
          await tx.query<PassRow>(q.pass, [
            this.name,
            owner,
            enqueues.map((e) => e.id),
            enqueues.map((e) => e.workload),
            enqueues.map((e) => e.timeoutMs ?? null),
            inputs.flatMap((i) => (i.release ? [i.release] : [])),
            inputs.flatMap((i) => (i.cancel ? [i.cancel] : [])),
            inputs.flatMap((i) => i.heartbeat ?? []),
            this.settings.queueEntryTtlMs,
            this.limits.maxConcurrent,
            this.limits.leaseTtlMs,
          ])
        ).rows;
        const state = decodePass(rows);
        if (!state) {
          throw new Error(`limiter \`${this.name}\` is not registered in schema \`${this.settings.schema}\``);
        }
        const plan = planPass(state, enqueues);
        let grants: LeaseRow[] = [];
        if (plan.grants.length > 0 || plan.dropped.length > 0) {
          const chosen = plan.grants;
          grants = (
            await tx.query<LeaseRow>(q.grant, [
              this.name,
              chosen.map((g) => g.id),
              chosen.map((g) => g.workload),
              chosen.map((g) => g.owner),
              chosen.map((g) => g.owner === owner),
              chosen.map((g) => g.seq),
              plan.dropped,
              this.limits.leaseTtlMs,
              this.settings.offerTtlMs,
              channelPrefix,
            ])
          ).rows;
        }
        return { grants, state, plan };
      },
      { synchronousCommit: this.settings.synchronousCommit },
    );
    this.#nextExpiryAt = state.nextExpiryMs === undefined ? Infinity : this.#clock.now() + state.nextExpiryMs;
    this.metrics.passes++;
    const direct = grants.filter((g) => !g.offered && g.owner === owner);
    this.metrics.directGrants += direct.length;
    this.metrics.offersMade += grants.length - direct.length;
    this.metrics.offersClaimedOnPoll += state.claimed.length;
    // After commit: hand direct grants and claimed offers to the waiters of this process.
    for (const row of [...direct, ...state.claimed]) this.#deliver(row);
    return inputs.map((input) => ({
      outcome: input.enqueue ? plan.outcomes.get(input.enqueue.id) : undefined,
      present: input.heartbeat ? state.present : undefined,
    }));
  }

  #deliver(row: LeaseRow): void {
    const deliver = this.#registry.get(row.waiter_id ?? '');
    if (deliver) deliver(row);
    else void this.release(this.#lease(row)).catch(() => undefined);
  }

  /**
   * Claims and renewals only push an expiry later. If a database crash forgot one, the lease
   * would just lapse sooner (its holder then loses it, safely), so they need not wait for a
   * WAL flush, whatever `synchronousCommit` says about grants.
   */
  async #extend(sql: string, params: unknown[]): Promise<LeaseRow[]> {
    return this.#db.transaction(async (tx) => (await tx.query<LeaseRow>(sql, params)).rows, {
      synchronousCommit: false,
    });
  }

  async renew(lease: ConcurrencyLease<W>): Promise<ConcurrencyLease<W> | undefined> {
    try {
      const row = (await this.#extend(this.#q.renew, [lease.id, this.limits.leaseTtlMs]))[0];
      return row ? (this.#lease(row) as ConcurrencyLease<W>) : undefined;
    } catch (error) {
      throw this.#errors.failure(error, lease.workload, {});
    }
  }

  async release(lease: ConcurrencyLease<W> | ConcurrencyLease<string>): Promise<void> {
    try {
      await this.ready();
      await this.#passes.submit({ release: lease.id });
    } catch (error) {
      throw this.#errors.failure(error, lease.workload, {});
    }
  }

  async stats(): Promise<ConcurrencyStats<W>> {
    await this.ready();
    const rows = (
      await this.#db.query<{ kind: 'active' | 'queued'; workload: string; n: number }>(this.#q.stats, [
        this.name,
        this.settings.queueEntryTtlMs,
      ])
    ).rows;
    const index = new Map<string, number>(this.limits.workloads.map((w) => [w.name, w.index]));
    const counts = { active: this.limits.workloads.map(() => 0), queued: this.limits.workloads.map(() => 0) };
    for (const row of rows) {
      const i = index.get(row.workload);
      if (i !== undefined) counts[row.kind][i] = row.n;
    }
    return statsOf(this.limits, counts);
  }

  /** Stops polling, leaves the LISTEN session, and fails the requests still waiting. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#cancelPoll();
    for (const waiter of [...this.#waiters.values()]) {
      const error = this.#errors.failure(
        new Error('the limiter was closed'),
        waiter.workload,
        waiter.request,
      );
      this.#end(waiter, { error, deadline: false });
    }
    await this.#hub.leave(this);
  }

  #lease(row: LeaseRow): ConcurrencyLease<string> {
    return {
      id: row.id,
      limiter: this.name,
      workload: row.workload,
      acquiredAt: row.acquired_at,
      expiresAt: row.expires_at,
      fence: row.fence,
    };
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
