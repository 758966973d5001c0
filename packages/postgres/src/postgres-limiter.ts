import { randomUUID } from 'node:crypto';
import {
  ConcurrencyConfigError,
  ConcurrencyError,
  ConcurrencyLimiterError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  allocate,
  lineageOf,
  resolveLimiterOptions,
  resolveWorkload,
  type AcquireRequest,
  type AllocationLimits,
  type ConcurrencyLease,
  type ConcurrencyLimiter,
  type ConcurrencyLimiterOptions,
  type ConcurrencyStats,
  type ResolvedLimits,
  type WorkloadStats,
} from 'sluice/concurrency';
import { toDatabase, type Database, type DatabaseInput, type SqlClient } from './database.js';
import { channelPrefix, hubFor, type ListenHub, type OfferNotice } from './hub.js';
import { limiterQueries, type LeaseRow, type LimiterQueries } from './queries.js';
import { defaultSchema, ensureSchema } from './schema.js';

/** Options of {@link createPostgresConcurrencyLimiter}: the limiter's, plus where and how to store it. */
export interface PostgresConcurrencyLimiterOptions<
  W extends string = string,
> extends ConcurrencyLimiterOptions<W> {
  /** A `pg.Pool`, a PGlite instance, or any `Database`. */
  db: DatabaseInput;
  /**
   * Schema of the limiter's tables.
   * @default 'sluice'
   */
  schema?: string;
  /**
   * How often a process checks for slots while it has waiting requests and no LISTEN
   * session. One batched check per limiter per process, not one per request.
   * @default 100
   */
  pollIntervalMs?: number;
  /**
   * The same check while LISTEN wake-ups are working: then it only refreshes the queue
   * entries and catches a lost notification.
   * @default 1000 (or pollIntervalMs, if larger)
   */
  fallbackPollIntervalMs?: number;
  /**
   * How long a queue entry survives without a heartbeat (its process is gone after that).
   * @default 15000
   */
  queueEntryTtlMs?: number;
  /**
   * How long a slot offered to a waiter of another process is kept for it.
   * @default the smaller of leaseTtlMs and 5000
   */
  offerTtlMs?: number;
  /**
   * Create the tables on first use (under an advisory lock). Pass `false` when the role
   * cannot run DDL, and apply `postgresConcurrencySchemaSql()` as a migration.
   * @default true
   */
  ensureSchema?: boolean;
  /**
   * What to do when the database holds different limits for this name: `'error'` refuses
   * with `ConcurrencyConfigError`; `'replace'` stores these limits (deploy every worker together).
   * @default 'error'
   */
  onConflict?: 'error' | 'replace';
  /**
   * Use LISTEN/NOTIFY to hand freed slots on at once (one extra connection per process).
   * @default true
   */
  listen?: boolean;
  /**
   * Whether an allocation's commit waits for its WAL flush. `false` roughly halves the time
   * the limiter's row lock is held on a disk with slow flushes; the price is that a database
   * crash can forget the grants of its last moments, so for up to one request's length more
   * requests may run than the limit allows.
   * @default true
   */
  synchronousCommit?: boolean;
}

const postgresKeys = new Set([
  'db',
  'schema',
  'pollIntervalMs',
  'fallbackPollIntervalMs',
  'queueEntryTtlMs',
  'offerTtlMs',
  'ensureSchema',
  'onConflict',
  'listen',
  'synchronousCommit',
]);

export const postgresLimiterDefaults = Object.freeze({
  schema: defaultSchema,
  pollIntervalMs: 100,
  fallbackPollIntervalMs: 1000,
  queueEntryTtlMs: 15_000,
  maxOfferTtlMs: 5000,
});

/** The limits as stored in the database: every worker sharing a name must agree on them. */
interface StoredLimits {
  maxConcurrent: number;
  maxQueued: number | null;
  leaseTtlMs: number;
  defaultWorkload: string | null;
  workloads: {
    name: string;
    maxConcurrent: number;
    reserved: number;
    priority: number;
    maxWaitMs: number | null;
  }[];
}

function storedForm(limits: ResolvedLimits<string>): StoredLimits {
  return {
    maxConcurrent: limits.maxConcurrent,
    maxQueued: limits.maxQueued ?? null,
    leaseTtlMs: limits.leaseTtlMs,
    defaultWorkload: limits.defaultWorkload ?? null,
    workloads: limits.workloads.map((w) => ({
      name: w.name,
      maxConcurrent: w.maxConcurrent,
      reserved: w.reserved,
      priority: w.priority,
      maxWaitMs: w.maxWaitMs ?? null,
    })),
  };
}

function differences(mine: StoredLimits, stored: StoredLimits): string[] {
  const out: string[] = [];
  for (const key of ['maxConcurrent', 'maxQueued', 'leaseTtlMs', 'defaultWorkload'] as const) {
    if (mine[key] !== stored[key]) out.push(`${key} ${mine[key]} here, ${stored[key]} stored`);
  }
  const names = (l: StoredLimits) => l.workloads.map((w) => w.name).join(', ');
  if (names(mine) !== names(stored)) out.push(`workloads (${names(mine)}) here, (${names(stored)}) stored`);
  else {
    for (const [i, w] of mine.workloads.entries()) {
      const s = stored.workloads[i]!;
      for (const key of ['maxConcurrent', 'reserved', 'priority', 'maxWaitMs'] as const) {
        if (w[key] !== s[key]) out.push(`workloads.${w.name}.${key} ${w[key]} here, ${s[key]} stored`);
      }
    }
  }
  return out;
}

function allocationLimits(stored: StoredLimits): AllocationLimits {
  const reserved = stored.workloads.reduce((sum, w) => sum + w.reserved, 0);
  return {
    maxConcurrent: stored.maxConcurrent,
    sharedSlots: stored.maxConcurrent - reserved,
    workloads: stored.workloads,
  };
}

/**
 * A local waiting request.
 *
 *   waiting --granted or offer claimed--> done (resolved)
 *   waiting --offer announced--> claiming --claimed--> done | --offer gone--> waiting (enqueued again)
 *   waiting --aborted or deadline--> leaving --queue entry and any offer removed--> done (rejected)
 */
interface LocalWaiter {
  readonly id: string;
  readonly workload: string;
  readonly request: AcquireRequest<string>;
  readonly startedAt: number;
  readonly timeoutMs: number | undefined;
  state: 'waiting' | 'claiming' | 'leaving' | 'done';
  /** The enqueue pass in flight; leaving waits for it, so no queue entry is left behind. */
  enqueued: Promise<unknown> | undefined;
  /** Set when cancellation or the deadline comes while a claim is in flight. */
  abort: unknown;
  timer: ReturnType<typeof setTimeout> | undefined;
  onAbort: (() => void) | undefined;
  resolve(lease: ConcurrencyLease<string>): void;
  reject(error: unknown): void;
}

interface PassInput {
  enqueue?: LocalWaiter;
  release?: string;
  cancel?: string;
  /** Waiters of this limiter to keep alive, and whose pending offers to claim. */
  heartbeat?: string[];
}

interface PassResult {
  outcome: 'granted' | 'waiting' | 'queue-full' | 'timed-out' | undefined;
  /** For a queue-full outcome: how many requests were waiting. */
  queued: number;
  present: Set<string> | undefined;
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
 */
export class PostgresConcurrencyLimiter<W extends string = 'default'> implements ConcurrencyLimiter<W> {
  readonly name: string;
  readonly limits: ResolvedLimits<W>;
  readonly settings: Readonly<{
    schema: string;
    pollIntervalMs: number;
    fallbackPollIntervalMs: number;
    queueEntryTtlMs: number;
    offerTtlMs: number;
    ensureSchema: boolean;
    onConflict: 'error' | 'replace';
    listen: boolean;
    synchronousCommit: boolean;
  }>;

  readonly #db: Database;
  readonly #q: LimiterQueries;
  readonly #hub: ListenHub;
  readonly #registry: Map<string, (row: LeaseRow) => void>;
  readonly #waiters = new Map<string, LocalWaiter>();
  #ready: Promise<void> | undefined;
  /**
   * What this limiter object did, for dashboards and tuning: allocation transactions, and how
   * slots reached its waiting requests (directly, by an offer claimed after a NOTIFY or by a
   * poll, or by enqueueing again after an offer lapsed or an entry was lost).
   */
  readonly metrics = {
    passes: 0,
    polls: 0,
    directGrants: 0,
    offersMade: 0,
    offersClaimedOnNotify: 0,
    offersClaimedOnPoll: 0,
    requeued: 0,
  };
  #batch: { input: PassInput; resolve(result: PassResult): void; reject(error: unknown): void }[] = [];
  #batching = false;
  #pollTimer: ReturnType<typeof setTimeout> | undefined;
  #pollAt = Infinity;
  #polling = false;
  /** Local time at which the next known lease lapses (from the last allocation seen). */
  #nextExpiryAt = Infinity;
  #closed = false;

  constructor(options: PostgresConcurrencyLimiterOptions<W>) {
    this.limits = resolveLimiterOptions(options, postgresKeys);
    this.name = this.limits.name;
    const whole = (field: string, value: unknown, fallback: number, min = 1): number => {
      if (value === undefined) return fallback;
      if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
        throw new ConcurrencyConfigError(
          `Expected \`${field}\` to be a whole number >= ${min}, got \`${String(value)}\``,
          { limiter: this.name, field, value },
        );
      }
      return value;
    };
    if (options.db === undefined || options.db === null || typeof options.db !== 'object') {
      throw new ConcurrencyConfigError('Expected `db` to be a pg.Pool, a PGlite instance or a Database', {
        limiter: this.name,
        field: 'db',
        value: options.db,
      });
    }
    const schema = options.schema ?? postgresLimiterDefaults.schema;
    if (typeof schema !== 'string' || !/^[A-Za-z_][A-Za-z0-9_]{0,62}$/.test(schema)) {
      throw new ConcurrencyConfigError(
        `Expected \`schema\` to be a plain SQL identifier, got \`${String(schema)}\``,
        {
          limiter: this.name,
          field: 'schema',
          value: schema,
        },
      );
    }
    if (
      options.onConflict !== undefined &&
      options.onConflict !== 'error' &&
      options.onConflict !== 'replace'
    ) {
      throw new ConcurrencyConfigError(
        `Expected \`onConflict\` to be 'error' or 'replace', got \`${String(options.onConflict)}\``,
        { limiter: this.name, field: 'onConflict', value: options.onConflict },
      );
    }
    const pollIntervalMs = whole(
      'pollIntervalMs',
      options.pollIntervalMs,
      postgresLimiterDefaults.pollIntervalMs,
    );
    this.settings = Object.freeze({
      schema,
      pollIntervalMs,
      fallbackPollIntervalMs: whole(
        'fallbackPollIntervalMs',
        options.fallbackPollIntervalMs,
        Math.max(postgresLimiterDefaults.fallbackPollIntervalMs, pollIntervalMs),
      ),
      queueEntryTtlMs: whole(
        'queueEntryTtlMs',
        options.queueEntryTtlMs,
        postgresLimiterDefaults.queueEntryTtlMs,
      ),
      offerTtlMs: whole(
        'offerTtlMs',
        options.offerTtlMs,
        Math.min(this.limits.leaseTtlMs, postgresLimiterDefaults.maxOfferTtlMs),
      ),
      ensureSchema: options.ensureSchema ?? true,
      onConflict: options.onConflict ?? 'error',
      listen: options.listen ?? true,
      synchronousCommit: options.synchronousCommit ?? true,
    });
    this.#db = toDatabase(options.db);
    this.#q = limiterQueries(schema);
    this.#hub = hubFor(options.db, this.#db);
    let registry = registries.get(this.#hub);
    if (!registry) registries.set(this.#hub, (registry = new Map()));
    this.#registry = registry;
    this.#hub.join(this);
  }

  validateWorkload(workload?: string): W {
    return resolveWorkload(this.limits, workload).name;
  }

  /** Creates the tables if needed and stores or checks the limits. Runs once; acquire calls it. */
  ready(): Promise<void> {
    this.#ready ??= this.#prepare().catch((error: unknown) => {
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
    let workload: string;
    try {
      workload = this.validateWorkload(request.workload);
    } catch (error) {
      if (error instanceof Error) Object.assign(error, lineageOf(request));
      return Promise.reject(error);
    }
    if (request.signal?.aborted) return Promise.reject(request.signal.reason);
    if (request.timeoutMs !== undefined && request.timeoutMs <= 0) {
      return Promise.reject(this.#timeout(workload, request, 0, Math.max(0, request.timeoutMs)));
    }
    const maxWaitMs = this.limits.workloads.find((w) => w.name === workload)!.maxWaitMs;
    const timeoutMs =
      maxWaitMs === undefined ? request.timeoutMs : Math.min(maxWaitMs, request.timeoutMs ?? Infinity);
    return this.#acquire(workload, request, timeoutMs) as Promise<ConcurrencyLease<W>>;
  }

  async #acquire(
    workload: string,
    request: AcquireRequest<string>,
    timeoutMs: number | undefined,
  ): Promise<ConcurrencyLease<string>> {
    if (this.#closed) throw this.#failure(new Error('the limiter is closed'), workload, request);
    try {
      await this.ready();
    } catch (error) {
      throw this.#failure(error, workload, request);
    }
    if (request.signal?.aborted) throw request.signal.reason;

    let resolve!: (lease: ConcurrencyLease<string>) => void;
    let reject!: (error: unknown) => void;
    const promise = new Promise<ConcurrencyLease<string>>((res, rej) => ((resolve = res), (reject = rej)));
    const waiter: LocalWaiter = {
      id: randomUUID(),
      workload,
      request,
      startedAt: Date.now(),
      timeoutMs,
      state: 'waiting',
      enqueued: undefined,
      abort: undefined,
      timer: undefined,
      onAbort: undefined,
      resolve,
      reject,
    };
    this.#waiters.set(waiter.id, waiter);
    this.#registry.set(waiter.id, (row) => this.#granted(waiter, row));
    const signal = request.signal;
    if (signal) {
      waiter.onAbort = () => this.#leave(waiter, signal.reason);
      signal.addEventListener('abort', waiter.onAbort, { once: true });
    }
    if (this.settings.listen) void this.#hub.ensureListening();
    await this.#enqueue(waiter);
    return promise;
  }

  /** Puts the waiter in the queue (again, if its entry was lost) and handles the immediate answer. */
  async #enqueue(waiter: LocalWaiter): Promise<void> {
    const pass = this.#pass({ enqueue: waiter });
    waiter.enqueued = pass;
    let result: PassResult;
    try {
      result = await pass;
    } catch (error) {
      this.#finish(waiter);
      waiter.reject(this.#failure(error, waiter.workload, waiter.request));
      return;
    }
    if (waiter.state === 'done') return;
    const waited = Date.now() - waiter.startedAt;
    switch (result.outcome) {
      case 'queue-full':
        this.#finish(waiter);
        waiter.reject(
          new ConcurrencyQueueFullError({
            limiter: this.name,
            workload: waiter.workload,
            ...lineageOf(waiter.request),
            maxQueued: this.limits.maxQueued ?? 0,
            queued: result.queued,
          }),
        );
        return;
      case 'timed-out':
        this.#finish(waiter);
        waiter.reject(this.#timeout(waiter.workload, waiter.request, waited, waiter.timeoutMs ?? 0));
        return;
      case 'waiting':
        if (waiter.timeoutMs !== undefined && waiter.timer === undefined) {
          waiter.timer = setTimeout(
            () =>
              this.#leave(
                waiter,
                this.#timeout(
                  waiter.workload,
                  waiter.request,
                  Date.now() - waiter.startedAt,
                  waiter.timeoutMs!,
                ),
              ),
            Math.max(0, waiter.timeoutMs - waited),
          );
        }
        this.#schedulePoll();
        return;
      default:
        return;
    }
  }

  /** A slot for a local waiter: resolve it, or give the slot back if the waiter has gone. */
  #granted(waiter: LocalWaiter, row: LeaseRow): void {
    const lease = this.#lease(row);
    if ((waiter.state === 'waiting' || waiter.state === 'claiming') && waiter.abort === undefined) {
      this.#finish(waiter);
      waiter.resolve(lease);
      return;
    }
    void this.release(lease).catch(() => undefined);
    if (waiter.state === 'claiming') {
      this.#finish(waiter);
      waiter.reject(waiter.abort);
    }
  }

  #leave(waiter: LocalWaiter, error: unknown): void {
    if (waiter.state === 'claiming') {
      waiter.abort ??= error;
      return;
    }
    if (waiter.state !== 'waiting') return;
    waiter.state = 'leaving';
    this.#clearWaitResources(waiter);
    void (async () => {
      await waiter.enqueued?.catch(() => undefined);
      try {
        await this.#pass({ cancel: waiter.id });
      } catch {
        // The entry lapses after queueEntryTtlMs without heartbeats, and any slot it was
        // offered after offerTtlMs: nothing stays held for long.
      }
      this.#finish(waiter);
      waiter.reject(error);
    })();
  }

  #clearWaitResources(waiter: LocalWaiter): void {
    clearTimeout(waiter.timer);
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
      rows = await this.#extend(this.#q.claim, [leaseIds, this.limits.leaseTtlMs]);
      this.metrics.offersClaimedOnNotify += rows.length;
    } catch {
      // Claiming failed; the next poll claims what is still on offer.
    }
    for (const row of rows) {
      const deliver = this.#registry.get(row.waiter_id ?? '');
      if (deliver) deliver(row);
      else void this.release(this.#lease(row)).catch(() => undefined);
    }
    for (const waiter of waiters) {
      if (waiter.state !== 'claiming') continue;
      // The offer lapsed before it could be claimed; the queue entry went with the offer.
      waiter.state = 'waiting';
      if (waiter.abort !== undefined) {
        this.#finish(waiter);
        waiter.reject(waiter.abort);
      } else {
        this.metrics.requeued++;
        void this.#enqueue(waiter);
      }
    }
  }

  onListenChange(listening: boolean): void {
    clearTimeout(this.#pollTimer);
    this.#pollTimer = undefined;
    this.#pollAt = Infinity;
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
    const interval = this.#hub.listening
      ? this.settings.fallbackPollIntervalMs
      : this.settings.pollIntervalMs;
    // Look again at the routine interval, or just after the next lease lapses if sooner.
    const at = Math.min(Date.now() + interval, this.#nextExpiryAt + 5);
    if (this.#pollTimer && this.#pollAt <= at) return;
    clearTimeout(this.#pollTimer);
    this.#pollAt = at;
    this.#pollTimer = setTimeout(
      () => {
        this.#pollTimer = undefined;
        this.#pollAt = Infinity;
        void this.#poll();
      },
      Math.max(0, at - Date.now()),
    );
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
      const result = await this.#pass({ heartbeat: ids });
      for (const id of ids) {
        const waiter = this.#waiters.get(id);
        if (waiter?.state !== 'waiting' || result.present?.has(id)) continue;
        // The entry is gone without a grant: past its deadline, or dropped while this
        // process was unresponsive for longer than queueEntryTtlMs.
        const waited = Date.now() - waiter.startedAt;
        if (waiter.timeoutMs !== undefined && waited >= waiter.timeoutMs - 50) {
          this.#leave(waiter, this.#timeout(waiter.workload, waiter.request, waited, waiter.timeoutMs));
        } else {
          this.metrics.requeued++;
          void this.#enqueue(waiter);
        }
      }
    } catch {
      // The database is unreachable: keep waiting. Deadlines still end each wait.
    } finally {
      this.#polling = false;
      this.#schedulePoll();
    }
  }

  /**
   * Asks for an allocation pass. Everything this limiter object has to say while a pass is
   * under way is batched into the next one, so a process has at most one transaction waiting
   * for the limiter's row lock, however busy it is.
   */
  #pass(input: PassInput): Promise<PassResult> {
    return new Promise<PassResult>((resolve, reject) => {
      this.#batch.push({ input, resolve, reject });
      if (this.#batching) return;
      this.#batching = true;
      queueMicrotask(() => void this.#runBatches());
    });
  }

  async #runBatches(): Promise<void> {
    while (this.#batch.length > 0) {
      const ops = this.#batch;
      this.#batch = [];
      try {
        const results = await this.#runPass(ops.map((o) => o.input));
        ops.forEach((o, i) => o.resolve(results[i]!));
      } catch (error) {
        for (const o of ops) o.reject(error);
      }
    }
    this.#batching = false;
  }

  /** One allocation: a short transaction on the limiter's row lock, for a batch of changes. */
  async #runPass(inputs: PassInput[]): Promise<PassResult[]> {
    const q = this.#q;
    const owner = this.#hub.owner;
    const enqueues = inputs.flatMap((i) => (i.enqueue ? [i.enqueue] : []));
    const heartbeat = inputs.flatMap((i) => i.heartbeat ?? []);
    const { grants, claimed, outcomes, queuedError, present, nextExpiryMs } = await this.#db.transaction(
      async (tx: SqlClient) => {
        type PassRow = {
          kind: string;
          workload: string | null;
          n: number | null;
          id: string | null;
          owner: string | null;
          seq: number | null;
        } & Omit<LeaseRow, 'id' | 'workload' | 'owner' | 'offered'>;
        const rows = (
          await tx.query<PassRow>(q.pass, [
            this.name,
            owner,
            enqueues.map((e) => e.id),
            enqueues.map((e) => e.workload),
            enqueues.map((e) => e.timeoutMs ?? null),
            inputs.flatMap((i) => (i.release ? [i.release] : [])),
            inputs.flatMap((i) => (i.cancel ? [i.cancel] : [])),
            heartbeat,
            this.settings.queueEntryTtlMs,
            this.limits.maxConcurrent,
            this.limits.leaseTtlMs,
          ])
        ).rows;
        const limitsRow = rows.find((r) => r.kind === 'limits');
        if (!limitsRow) {
          throw new Error(`limiter \`${this.name}\` is not registered in schema \`${this.settings.schema}\``);
        }
        const stored = JSON.parse(limitsRow.id!) as StoredLimits;
        const index = new Map(stored.workloads.map((w, i) => [w.name, i]));
        const active = stored.workloads.map(() => 0);
        const waiting: { seq: number; id: string; owner: string; workload: string }[][] =
          stored.workloads.map(() => []);
        const present = new Set<string>();
        const claimed: LeaseRow[] = [];
        let queued = 0;
        let nextExpiryMs: number | undefined;
        for (const row of rows) {
          if (row.kind === 'present') present.add(row.id!);
          else if (row.kind === 'next-expiry') nextExpiryMs = row.seq!;
          else if (row.kind === 'claimed') claimed.push({ ...row, offered: false } as unknown as LeaseRow);
          const i = row.workload === null ? undefined : index.get(row.workload);
          if (i === undefined) continue;
          if (row.kind === 'active') active[i] = row.n!;
          else if (row.kind === 'queued') queued += row.n!;
          else if (row.kind === 'head') {
            waiting[i]!.push({ seq: row.seq!, id: row.id!, owner: row.owner!, workload: row.workload! });
          }
        }
        for (const list of waiting) list.sort((a, b) => a.seq - b.seq);

        // Deadlines and lapsed entries were swept in SQL, in database time; the rules see
        // only live entries.
        const chosen = allocate({ limits: allocationLimits(stored), active, waiting, now: 0 }).grants.map(
          (g) => g.entry,
        );
        const granted = new Set(chosen.map((g) => g.id));
        // New entries that got no slot stay in the queue, in arrival order, unless the queue
        // is full or they may not wait at all.
        const outcomes = new Map<string, PassResult['outcome']>();
        const queuedError = new Map<string, number>();
        const dropped: string[] = [];
        let others = queued - chosen.length - enqueues.filter((e) => !granted.has(e.id)).length;
        for (const e of enqueues) {
          if (granted.has(e.id)) outcomes.set(e.id, 'granted');
          else if (this.limits.maxQueued !== undefined && others >= this.limits.maxQueued) {
            outcomes.set(e.id, 'queue-full');
            queuedError.set(e.id, others);
            dropped.push(e.id);
          } else if (e.timeoutMs === 0) {
            outcomes.set(e.id, 'timed-out');
            dropped.push(e.id);
          } else {
            outcomes.set(e.id, 'waiting');
            others++;
          }
        }
        let grants: LeaseRow[] = [];
        if (chosen.length > 0 || dropped.length > 0) {
          grants = (
            await tx.query<LeaseRow>(q.grant, [
              this.name,
              chosen.map((g) => g.id),
              chosen.map((g) => g.workload),
              chosen.map((g) => g.owner),
              chosen.map((g) => g.owner === owner),
              chosen.map((g) => g.seq),
              dropped,
              this.limits.leaseTtlMs,
              this.settings.offerTtlMs,
              channelPrefix,
            ])
          ).rows;
        }
        return { grants, claimed, outcomes, queuedError, present, nextExpiryMs };
      },
      { synchronousCommit: this.settings.synchronousCommit },
    );
    this.#nextExpiryAt = nextExpiryMs === undefined ? Infinity : Date.now() + nextExpiryMs;
    this.metrics.passes++;
    const direct = grants.filter((g) => !g.offered && g.owner === owner);
    this.metrics.directGrants += direct.length;
    this.metrics.offersMade += grants.length - direct.length;
    this.metrics.offersClaimedOnPoll += claimed.length;
    // After commit: hand direct grants and claimed offers to the waiters of this process.
    for (const row of [...direct, ...claimed]) {
      const deliver = this.#registry.get(row.waiter_id ?? '');
      if (deliver) deliver(row);
      else void this.release(this.#lease(row)).catch(() => undefined);
    }
    return inputs.map((input) => ({
      outcome: input.enqueue ? outcomes.get(input.enqueue.id) : undefined,
      queued: input.enqueue ? (queuedError.get(input.enqueue.id) ?? 0) : 0,
      present: input.heartbeat ? present : undefined,
    }));
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
      throw this.#failure(error, lease.workload, {});
    }
  }

  async release(lease: ConcurrencyLease<W> | ConcurrencyLease<string>): Promise<void> {
    try {
      await this.ready();
      await this.#pass({ release: lease.id });
    } catch (error) {
      throw this.#failure(error, lease.workload, {});
    }
  }

  async stats(): Promise<ConcurrencyStats<W>> {
    await this.ready();
    const rows = (
      await this.#db.query<{ kind: string; workload: string; n: number }>(this.#q.stats, [
        this.name,
        this.settings.queueEntryTtlMs,
      ])
    ).rows;
    const workloads = {} as Record<W, WorkloadStats>;
    for (const w of this.limits.workloads) workloads[w.name] = { active: 0, queued: 0 };
    let active = 0;
    let queued = 0;
    for (const row of rows) {
      const w = (workloads as Record<string, { active: number; queued: number }>)[row.workload];
      if (row.kind === 'active') {
        active += row.n;
        if (w) w.active = row.n;
      } else {
        queued += row.n;
        if (w) w.queued = row.n;
      }
    }
    return { active, queued, workloads };
  }

  /** Stops polling, leaves the LISTEN session, and fails the requests still waiting. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#pollTimer);
    this.#pollTimer = undefined;
    for (const waiter of [...this.#waiters.values()]) {
      this.#leave(
        waiter,
        this.#failure(new Error('the limiter was closed'), waiter.workload, waiter.request),
      );
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

  #timeout(workload: string, request: AcquireRequest<string>, waitMs: number, timeoutMs: number) {
    return new ConcurrencyTimeoutError({
      limiter: this.name,
      workload,
      ...lineageOf(request),
      waitMs,
      timeoutMs,
    });
  }

  #failure(error: unknown, workload: string, request: AcquireRequest<string>): ConcurrencyError {
    if (error instanceof ConcurrencyError) return error;
    const message = error instanceof Error ? error.message : String(error);
    return new ConcurrencyLimiterError(`PostgreSQL limiter \`${this.name}\` failed: ${message}`, {
      limiter: this.name,
      workload,
      ...lineageOf(request),
      cause: error,
    });
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
