/**
 * Model-based test: random sequences of acquire, cancel, time passing, renew and release run
 * against the in-memory limiter and against a deliberately naive reference model written
 * from the rules in the spec (and fair queuing by key: start tags, smallest first, from the
 * rule in allocate.ts, written again here with arrays). After every step the two must agree on every request's fate and
 * on the counts, and the limits must hold.
 *
 * Budgets and the provider's pause too (DESIGN.md part 3): token buckets that refill with the
 * manual clock, token estimates at acquire, usage and 429s at release, and the rule for a
 * head that does not fit a budget yet (allocate.ts), written again here: the model tries a
 * grant at every moment something could change (an expiry, a deadline, the pause's end, the
 * first millisecond each waiting request fits each budget, give or take one) and the two
 * must agree on who got what, when.
 */
import fc from 'fast-check';
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ConcurrencyConfigError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  ManualClock,
  createConcurrencyLimiter,
  type BudgetName,
  type ConcurrencyLease,
  type RateOptions,
  type WorkloadOptions,
} from 'sluice/concurrency';

const TTL = 100;

const RATE_FIELDS: Record<BudgetName, keyof RateOptions> = {
  requests: 'requestsPerMinute',
  tokens: 'tokensPerMinute',
  inputTokens: 'inputTokensPerMinute',
  outputTokens: 'outputTokensPerMinute',
};

interface Config {
  maxConcurrent: number;
  maxQueued: number | undefined;
  /** Per-minute figures by budget; absent: slots only. */
  rate: Partial<Record<BudgetName, number>> | undefined;
  workloads: {
    name: string;
    options: Required<Pick<WorkloadOptions, 'maxConcurrent' | 'reserved' | 'priority'>> & {
      maxWaitMs?: number;
    };
  }[];
}

type Op =
  | {
      kind: 'acquire';
      workload: number;
      key: number | undefined;
      timeoutMs: number | undefined;
      cancellable: boolean;
      tokens: { input: number; output: number } | undefined;
    }
  | { kind: 'cancel'; pick: number }
  | { kind: 'advance'; ms: number }
  | { kind: 'renew'; pick: number }
  | {
      kind: 'release';
      pick: number;
      usage: { input: number; output: number } | undefined;
      /** A 429 with this retry time (`null`: none given, 1 s). */
      throttle: number | null | undefined;
    };

const configArb: fc.Arbitrary<Config> = fc
  .record({
    maxConcurrent: fc.integer({ min: 1, max: 4 }),
    maxQueued: fc.option(fc.integer({ min: 0, max: 4 }), { nil: undefined }),
    workloads: fc.array(
      fc.record({
        ceiling: fc.integer({ min: 1, max: 4 }),
        reserved: fc.integer({ min: 0, max: 2 }),
        priority: fc.integer({ min: 0, max: 2 }),
        maxWaitMs: fc.option(fc.integer({ min: 0, max: 250 }), { nil: undefined }),
      }),
      { minLength: 1, maxLength: 3 },
    ),
    rate: fc.option(
      fc.record(
        {
          // Small enough that a scenario drains them and waits for their refill.
          requests: fc.constantFrom(2, 5, 60),
          tokens: fc.constantFrom(1_000, 2_000, 6_000),
          inputTokens: fc.constantFrom(1_000, 3_000),
          outputTokens: fc.constantFrom(300, 1_000),
        },
        { requiredKeys: [] },
      ),
      { nil: undefined, freq: 2 },
    ),
  })
  .map(({ maxConcurrent, maxQueued, workloads, rate }) => {
    let reservable = maxConcurrent;
    return {
      maxConcurrent,
      maxQueued,
      rate,
      workloads: workloads.map((w, i) => {
        const ceiling = Math.min(w.ceiling, maxConcurrent);
        const reserved = Math.min(w.reserved, ceiling, reservable);
        reservable -= reserved;
        const options = { maxConcurrent: ceiling, reserved, priority: w.priority };
        return {
          name: `w${i}`,
          options: w.maxWaitMs === undefined ? options : { ...options, maxWaitMs: w.maxWaitMs },
        };
      }),
    };
  })
  // A workload that reserves nothing when reservations take every slot is refused at creation.
  .filter(
    (c) =>
      c.workloads.reduce((sum, w) => sum + w.options.reserved, 0) < c.maxConcurrent ||
      c.workloads.every((w) => w.options.reserved > 0),
  );

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('acquire' as const),
      workload: fc.nat(2),
      key: fc.option(fc.nat(2), { nil: undefined }),
      timeoutMs: fc.option(fc.integer({ min: -1, max: 300 }), { nil: undefined, freq: 2 }),
      cancellable: fc.boolean(),
      tokens: fc.option(
        fc.record({
          // Mostly a fraction of the budgets; now and then more than a whole one.
          input: fc.oneof(
            { weight: 8, arbitrary: fc.integer({ min: 50, max: 600 }) },
            { weight: 1, arbitrary: fc.integer({ min: 0, max: 8_000 }) },
          ),
          output: fc.oneof(
            { weight: 8, arbitrary: fc.integer({ min: 0, max: 150 }) },
            { weight: 1, arbitrary: fc.integer({ min: 0, max: 1_500 }) },
          ),
        }),
        { nil: undefined, freq: 4 },
      ),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('cancel' as const), pick: fc.nat() }) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant('advance' as const),
      ms: fc.oneof(
        { weight: 6, arbitrary: fc.integer({ min: 1, max: 120 }) },
        { weight: 1, arbitrary: fc.integer({ min: 1_000, max: 30_000 }) },
      ),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('renew' as const), pick: fc.nat() }) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant('release' as const),
      pick: fc.nat(),
      usage: fc.option(
        fc.record({ input: fc.integer({ min: 0, max: 3_000 }), output: fc.integer({ min: 0, max: 1_000 }) }),
        { nil: undefined },
      ),
      throttle: fc.option(fc.oneof(fc.constant(null), fc.integer({ min: 1, max: 150 })), {
        nil: undefined,
        freq: 4,
      }),
    }),
  },
);

type Fate = 'waiting' | 'granted' | 'timed-out' | 'cancelled' | 'queue-full' | 'config-error';

// ---- The reference model: arrays and loops, no cleverness. ----

interface ModelRequest {
  id: number;
  workload: number;
  /** '' for a request without a key. */
  key: string;
  /** Start tag, once queued or granted. */
  tag: number;
  fate: Fate;
  deadline: number | undefined;
  /** Set while granted and the lease has not expired or been released. */
  leaseExpiresAt: number | undefined;
  /** When the lease released while held would have expired: until then a release repeats it. */
  releasedUntil?: number | undefined;
  everGranted: boolean;
  /** Its estimate, both parts present. */
  tokens: { input: number; output: number };
}

interface Bucket {
  level: number;
  at: number;
}

class Model {
  now = 0;
  requests: ModelRequest[] = [];
  /** Per workload: the tag of its latest grant. */
  virtualTime: number[];
  /** Per workload and key (`${workload}/${key}`): the tag of the key's latest grant. */
  lastGrant = new Map<string, number>();
  /** Each configured budget's level at a time; a bucket starts full. */
  buckets = new Map<BudgetName, Bucket>();
  pausedUntil = 0;
  constructor(readonly config: Config) {
    this.virtualTime = config.workloads.map(() => 0);
    for (const [name, figure] of Object.entries(config.rate ?? {}) as [BudgetName, number][]) {
      this.buckets.set(name, { level: figure, at: 0 });
    }
  }

  figure(name: BudgetName): number {
    return this.config.rate![name]!;
  }

  cost(name: BudgetName, tokens: { input: number; output: number }): number {
    if (name === 'requests') return 1;
    if (name === 'tokens') return tokens.input + tokens.output;
    return name === 'inputTokens' ? tokens.input : tokens.output;
  }

  /** A bucket's level at `t`: its level then, plus the refill since, up to the figure. */
  level(name: BudgetName, t = this.now): number {
    const b = this.buckets.get(name)!;
    return Math.min(this.figure(name), b.level + ((t - b.at) * this.figure(name)) / 60_000);
  }

  /** Adds `delta` to a bucket at the current time: never past the figure, at most one figure in debt. */
  change(name: BudgetName, delta: number): void {
    const figure = this.figure(name);
    this.buckets.set(name, {
      level: Math.min(figure, Math.max(-figure, this.level(name) + delta)),
      at: this.now,
    });
  }

  fits(name: BudgetName, tokens: { input: number; output: number }, t = this.now): boolean {
    return this.level(name, t) >= this.cost(name, tokens) - 1e-6;
  }

  /** The tag a new request of `key` in workload `w` starts with. */
  tagFor(w: number, key: string): number {
    const v = this.virtualTime[w]!;
    const queued = this.waiting().filter((r) => r.workload === w && r.key === key);
    if (queued.length > 0) return Math.max(v, Math.max(...queued.map((r) => r.tag)) + 1);
    const last = this.lastGrant.get(`${w}/${key}`);
    return last === undefined ? v : Math.max(v, last + 1);
  }

  grant(r: ModelRequest): void {
    for (const name of this.buckets.keys()) this.change(name, -this.cost(name, r.tokens));
    r.fate = 'granted';
    r.everGranted = true;
    r.leaseExpiresAt = this.now + TTL;
    this.virtualTime[r.workload] = Math.max(this.virtualTime[r.workload]!, r.tag);
    // A grant that empties the workload's queue: only the key just served keeps its history.
    if (!this.waiting().some((q) => q.workload === r.workload)) {
      for (const name of [...this.lastGrant.keys()]) {
        if (name.startsWith(`${r.workload}/`)) this.lastGrant.delete(name);
      }
    }
    this.lastGrant.set(`${r.workload}/${r.key}`, r.tag);
  }

  active(w: number): number {
    return this.requests.filter((r) => r.workload === w && r.leaseExpiresAt !== undefined).length;
  }

  /** A configuration is allowed when every limit holds and no reserved slot is used by another workload. */
  allowed(active: number[]): boolean {
    const { maxConcurrent, workloads } = this.config;
    const total = active.reduce((a, b) => a + b, 0);
    if (total > maxConcurrent) return false;
    if (active.some((a, i) => a > workloads[i]!.options.maxConcurrent)) return false;
    // Each workload occupies at least its reservation, whether it uses it or not.
    const occupied = active.reduce((sum, a, i) => sum + Math.max(a, workloads[i]!.options.reserved), 0);
    return occupied <= maxConcurrent;
  }

  canGrant(w: number): boolean {
    const active = this.config.workloads.map((_, i) => this.active(i));
    active[w]!++;
    return this.allowed(active);
  }

  waiting(): ModelRequest[] {
    return this.requests.filter((r) => r.fate === 'waiting');
  }

  grantAll(): void {
    if (this.now < this.pausedUntil) return;
    // Workloads closed by a head waiting for a budget, and the budgets such heads claim.
    const closed = new Set<number>();
    const claimed = new Set<BudgetName>();
    for (;;) {
      // Each open workload with room offers its head: smallest tag, then the longest waiter.
      const heads = this.config.workloads.flatMap((_, w) => {
        if (closed.has(w) || !this.canGrant(w)) return [];
        const queue = this.waiting().filter((r) => r.workload === w);
        queue.sort((a, b) => a.tag - b.tag || a.id - b.id);
        return queue.length > 0 ? [queue[0]!] : [];
      });
      if (heads.length === 0) return;
      // Highest priority first, then the longest waiter.
      heads.sort(
        (a, b) =>
          this.config.workloads[b.workload]!.options.priority -
            this.config.workloads[a.workload]!.options.priority || a.id - b.id,
      );
      const head = heads[0]!;
      const needs = [...this.buckets.keys()].filter((name) => this.cost(name, head.tokens) > 0);
      const blocked =
        needs.some((name) => claimed.has(name)) || needs.some((name) => !this.fits(name, head.tokens));
      if (blocked) {
        closed.add(head.workload);
        for (const name of needs) claimed.add(name);
        continue;
      }
      this.grant(head);
    }
  }

  /** Times after now at which a waiting request may come to fit a budget (give or take 1 ms). */
  refillTimes(): number[] {
    const times: number[] = [];
    for (const r of this.waiting()) {
      for (const [name, b] of this.buckets) {
        const short = this.cost(name, r.tokens) - b.level;
        if (short <= 0) continue;
        const t = b.at + Math.ceil((short * 60_000) / this.figure(name));
        times.push(t - 1, t, t + 1);
      }
    }
    return times.filter((t) => t > this.now);
  }

  acquire(
    id: number,
    workload: number,
    key: string,
    timeoutMs: number | undefined,
    tokens: { input: number; output: number } | undefined,
  ): ModelRequest {
    const w = this.config.workloads[workload]!;
    const wait = [w.options.maxWaitMs, timeoutMs]
      .filter((x) => x !== undefined)
      .reduce((a, b) => Math.min(a, b), Infinity);
    const r: ModelRequest = {
      id,
      workload,
      key,
      tag: 0,
      fate: 'waiting',
      deadline: undefined,
      leaseExpiresAt: undefined,
      everGranted: false,
      tokens: tokens ?? { input: 0, output: 0 },
    };
    if ([...this.buckets.keys()].some((name) => this.cost(name, r.tokens) > this.figure(name))) {
      r.fate = 'config-error';
    } else if (timeoutMs !== undefined && timeoutMs <= 0) {
      r.fate = 'timed-out';
    }
    if (r.fate !== 'waiting') {
      this.requests.push(r);
      return r;
    }
    // Tried as if queued: granted if the rules take it now.
    r.tag = this.tagFor(workload, key);
    this.requests.push(r);
    this.grantAll();
    if ((r.fate as Fate) === 'granted') return r;
    const others = this.waiting().length - 1;
    if (this.config.maxQueued !== undefined && others >= this.config.maxQueued) r.fate = 'queue-full';
    else if (wait <= 0) r.fate = 'timed-out';
    else r.deadline = wait === Infinity ? undefined : this.now + wait;
    return r;
  }

  advance(ms: number): void {
    const target = this.now + ms;
    for (;;) {
      const times = [
        ...this.requests.filter((r) => r.leaseExpiresAt !== undefined).map((r) => r.leaseExpiresAt!),
        ...this.waiting()
          .filter((r) => r.deadline !== undefined)
          .map((r) => r.deadline!),
        ...(this.pausedUntil > this.now ? [this.pausedUntil] : []),
        ...this.refillTimes(),
      ].filter((t) => t <= target);
      if (times.length === 0) break;
      this.now = Math.max(this.now, Math.min(...times));
      for (const r of this.requests)
        if (r.leaseExpiresAt !== undefined && r.leaseExpiresAt <= this.now) r.leaseExpiresAt = undefined;
      for (const r of this.waiting())
        if (r.deadline !== undefined && r.deadline <= this.now) r.fate = 'timed-out';
      this.grantAll();
    }
    this.now = target;
  }

  renew(r: ModelRequest): boolean {
    if (r.leaseExpiresAt === undefined || r.leaseExpiresAt <= this.now) return false;
    r.leaseExpiresAt = this.now + TTL;
    return true;
  }

  release(
    r: ModelRequest,
    usage: { input: number; output: number } | undefined,
    throttle: number | null | undefined,
  ): void {
    // A lease still held is settled to its usage; one gone (expired, released) is not.
    if (r.leaseExpiresAt !== undefined && usage !== undefined) {
      for (const name of this.buckets.keys()) {
        this.change(name, this.cost(name, r.tokens) - this.cost(name, usage));
      }
    }
    // The provider's 429 pauses every grant, whoever's lease it was, except when this release
    // repeats one already made (the lease's time is not up): its answer counted then.
    const repeated = r.leaseExpiresAt === undefined && (r.releasedUntil ?? -Infinity) > this.now;
    if (throttle !== undefined && !repeated)
      this.pausedUntil = Math.max(this.pausedUntil, this.now + (throttle ?? 1000));
    if (r.leaseExpiresAt !== undefined) r.releasedUntil = r.leaseExpiresAt;
    r.leaseExpiresAt = undefined;
    this.grantAll();
  }
}

// ---- The real limiter, observed from outside. ----

interface RealRequest {
  fate: Fate | 'other';
  lease: ConcurrencyLease<string> | undefined;
  controller: AbortController | undefined;
}

async function runScenario(config: Config, ops: Op[]): Promise<void> {
  const clock = new ManualClock(0);
  const rate =
    config.rate === undefined
      ? undefined
      : Object.fromEntries(
          (Object.entries(config.rate) as [BudgetName, number][]).map(([name, figure]) => [
            RATE_FIELDS[name],
            figure,
          ]),
        );
  const limiter = createConcurrencyLimiter({
    maxConcurrent: config.maxConcurrent,
    maxQueued: config.maxQueued,
    leaseTtlMs: TTL,
    clock,
    workloads: Object.fromEntries(config.workloads.map((w) => [w.name, w.options])),
    ...(rate && { rate }),
  });
  const model = new Model(config);
  const real: RealRequest[] = [];

  for (const [step, op] of ops.entries()) {
    const where = `step ${step} (${JSON.stringify(op)})`;
    switch (op.kind) {
      case 'acquire': {
        const workload = op.workload % config.workloads.length;
        const entry: RealRequest = {
          fate: 'waiting',
          lease: undefined,
          controller: op.cancellable ? new AbortController() : undefined,
        };
        real.push(entry);
        limiter
          .acquire({
            workload: config.workloads[workload]!.name,
            key: op.key === undefined ? undefined : `k${op.key}`,
            timeoutMs: op.timeoutMs,
            signal: entry.controller?.signal,
            tokens: op.tokens,
          })
          .then(
            (lease) => {
              entry.fate = 'granted';
              entry.lease = lease;
            },
            (error: unknown) => {
              if (error instanceof ConcurrencyTimeoutError) entry.fate = 'timed-out';
              else if (error instanceof ConcurrencyQueueFullError) entry.fate = 'queue-full';
              else if (error instanceof ConcurrencyConfigError) entry.fate = 'config-error';
              else if (error === entry.controller?.signal.reason) entry.fate = 'cancelled';
              else entry.fate = 'other';
            },
          );
        model.acquire(
          real.length - 1,
          workload,
          op.key === undefined ? '' : `k${op.key}`,
          op.timeoutMs,
          op.tokens,
        );
        break;
      }
      case 'cancel': {
        const waiting = model.requests.filter((r) => r.fate === 'waiting' && real[r.id]!.controller);
        if (waiting.length === 0) break;
        const target = waiting[op.pick % waiting.length]!;
        real[target.id]!.controller!.abort(new Error('cancelled by test'));
        target.fate = 'cancelled';
        // A head that waited for a budget held back the requests behind it: they may go now.
        model.grantAll();
        break;
      }
      case 'advance':
        clock.advance(op.ms);
        model.advance(op.ms);
        break;
      case 'renew':
      case 'release': {
        const granted = model.requests.filter((r) => r.everGranted);
        if (granted.length === 0) break;
        const target = granted[op.pick % granted.length]!;
        const lease = real[target.id]!.lease;
        expect(lease, `${where}: request ${target.id} should hold a lease object`).toBeDefined();
        if (op.kind === 'renew') {
          const renewed = await limiter.renew(lease!);
          const expected = model.renew(target);
          expect(renewed !== undefined, `${where}: renew of request ${target.id}`).toBe(expected);
          if (renewed) {
            expect(renewed.id).toBe(lease!.id);
            expect(renewed.expiresAt).toBe(clock.now() + TTL);
            real[target.id]!.lease = renewed;
          }
        } else {
          const provider =
            op.throttle === undefined
              ? undefined
              : { status: 429, ...(op.throttle !== null && { retryAfterMs: op.throttle }) };
          const details =
            op.usage === undefined && provider === undefined
              ? undefined
              : { ...(op.usage && { usage: op.usage }), ...(provider && { provider }) };
          await limiter.release(lease!, details);
          model.release(target, op.usage, op.throttle);
        }
        break;
      }
    }
    await flush();

    // Every request's fate matches the model.
    for (const r of model.requests) {
      expect(real[r.id]!.fate, `${where}: fate of request ${r.id}`).toBe(r.fate);
      if (r.fate === 'granted') expect(real[r.id]!.lease!.workload).toBe(config.workloads[r.workload]!.name);
    }
    // The counts match, and the limits hold.
    const stats = limiter.stats();
    const active = config.workloads.map((_, i) => model.active(i));
    expect(stats.active, `${where}: active`).toBe(active.reduce((a, b) => a + b, 0));
    expect(stats.queued, `${where}: queued`).toBe(model.waiting().length);
    for (const [i, w] of config.workloads.entries()) {
      expect(stats.workloads[w.name], `${where}: workload ${w.name}`).toEqual({
        active: active[i],
        queued: model.waiting().filter((r) => r.workload === i).length,
      });
    }
    expect(
      model.allowed(config.workloads.map((w) => stats.workloads[w.name]!.active)),
      `${where}: limits`,
    ).toBe(true);
    // No one waits while the rules would let them in (with slots only: a request may also
    // wait for a budget or for the pause's end, which the fates above already compare).
    if (config.rate === undefined && model.now >= model.pausedUntil) {
      for (const r of model.waiting())
        expect(model.canGrant(r.workload), `${where}: ${r.id} starved`).toBe(false);
    }
    // The budgets agree (to the token: `available` is rounded down, and the two count the
    // same refill in different steps, so a level a rounding error from a whole number may
    // round either way).
    for (const name of model.buckets.keys()) {
      const real = stats.budgets?.[name];
      expect(real?.capacity, `${where}: ${name} capacity`).toBe(model.figure(name));
      const expected = Math.max(0, Math.floor(model.level(name)));
      expect(Math.abs(real!.available - expected), `${where}: ${name} available`).toBeLessThanOrEqual(1);
      // Never more than the figure, never deeper than a figure in debt.
      expect(model.level(name)).toBeLessThanOrEqual(model.figure(name));
      expect(model.level(name)).toBeGreaterThanOrEqual(-model.figure(name));
    }
  }

  // Clean up: every slot back, nothing queued, no deadline timer left behind.
  for (const r of real) r.controller?.abort(new Error('end'));
  const released = new Set<RealRequest>();
  for (let round = 0; round <= real.length; round++) {
    for (const r of real) {
      if (r.lease && !released.has(r)) {
        released.add(r);
        await limiter.release(r.lease);
      }
    }
    // Past any pause and any refill (a bucket is at most one figure in debt: two minutes).
    clock.advance(2 * 60_000);
    await flush();
  }
  expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  // Nothing waits, so no wake timer is left: only the lease sweep, gone by now.
  expect(clock.pendingTimers).toBe(0);
}

describe('in-memory limiter against a reference model', () => {
  it('agrees with the model on random sequences of operations', async () => {
    await fc.assert(
      fc.asyncProperty(configArb, fc.array(opArb, { minLength: 1, maxLength: 60 }), runScenario),
      { numRuns: 1500 },
    );
  });

  it('rejects an unknown workload at runtime as well as at compile time', async () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1, workloads: { a: {} } });
    const name: string = 'b';
    await expect(limiter.acquire({ workload: name as 'a' })).rejects.toBeInstanceOf(ConcurrencyConfigError);
  });
});
