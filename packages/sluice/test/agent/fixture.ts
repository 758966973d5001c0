// The one setup of the agent tests: a provider stand-in on loopback, limiters and agents on
// one ManualClock, an event log, and a leak guard that fails a test which leaves anything
// behind.
import { getEventListeners } from 'node:events';
import { afterEach } from 'vitest';
import {
  createConcurrencyLimiter,
  type ConcurrencyEvent,
  type ConcurrencyLimiter,
  type ConcurrencyLimiterOptions,
} from 'sluice';
import { ManualClock, type ClockTimer } from 'sluice/concurrency';
import { startProviderStandIn, until, type ProviderStandIn, type StandInOptions } from '@sluice/testkit';

export { until };

/** A timer as the clock was asked for it. */
export interface TimerRecord {
  readonly ms: number;
  /** Set with `{ background: true }`: lease sweeps and renewals, which keep no process alive. */
  readonly background: boolean;
}

/**
 * A ManualClock that keeps its pending timers: a test waits for the timer it expects (a
 * retry's wait, a timeout) and advances by exactly its delay, and the leak guard counts the
 * timers a test left.
 */
export class TestClock extends ManualClock {
  readonly #pending = new Map<ClockTimer, TimerRecord>();
  #waiters: { match: (t: TimerRecord) => boolean; resolve: (t: TimerRecord) => void }[] = [];

  override setTimeout(callback: () => void, ms: number, options?: { background?: boolean }): ClockTimer {
    const record: TimerRecord = { ms, background: options?.background ?? false };
    const handle = super.setTimeout(() => {
      this.#pending.delete(handle);
      callback();
    }, ms);
    this.#pending.set(handle, record);
    const waiter = this.#waiters.find((w) => w.match(record));
    if (waiter) {
      this.#waiters = this.#waiters.filter((w) => w !== waiter);
      waiter.resolve(record);
    }
    return handle;
  }

  override clearTimeout(timer: ClockTimer): void {
    this.#pending.delete(timer);
    super.clearTimeout(timer);
  }

  /** Timers neither fired nor cleared, leaving out background ones. */
  get foregroundTimers(): TimerRecord[] {
    return [...this.#pending.values()].filter((t) => !t.background);
  }

  /** A pending timer that matches (by default any foreground one), now or once one is set. */
  timer(match: (t: TimerRecord) => boolean = (t) => !t.background): Promise<TimerRecord> {
    const pending = [...this.#pending.values()].find(match);
    if (pending) return Promise.resolve(pending);
    return new Promise((resolve) => this.#waiters.push({ match, resolve }));
  }
}

/** Concurrency events in order, and a way to wait for the nth of a type. */
export function eventLog() {
  const events: ConcurrencyEvent[] = [];
  let waiters: { type: string; count: number; resolve: () => void }[] = [];
  const count = (type: string) => events.filter((e) => e.type === type).length;
  return {
    events,
    onConcurrency(event: ConcurrencyEvent) {
      events.push(event);
      const ready = waiters.filter((w) => count(w.type) >= w.count);
      waiters = waiters.filter((w) => !ready.includes(w));
      for (const w of ready) w.resolve();
    },
    types: () => events.map((e) => e.type),
    of: <T extends ConcurrencyEvent['type']>(type: T) =>
      events.filter((e): e is Extract<ConcurrencyEvent, { type: T }> => e.type === type),
    /** Resolves once `n` events of `type` have been heard. */
    seen(type: ConcurrencyEvent['type'], n = 1): Promise<void> {
      if (count(type) >= n) return Promise.resolve();
      return new Promise((resolve) => waiters.push({ type, count: n, resolve }));
    },
  };
}

type Api = 'openai-completions' | 'anthropic-messages';
/** What the guard reads of a limiter. */
type Watched = Pick<ConcurrencyLimiter<string>, 'name' | 'stats'>;

export class AgentFixture {
  readonly credentials = { apiKey: 'test-key' };
  #clock = new TestClock();
  #standIns: ProviderStandIn[] = [];
  #limiters: Watched[] = [];
  #signals: AbortSignal[] = [];

  /** The test's clock; limiters from `limiter()` use it, and agents should too. */
  get clock(): TestClock {
    return this.#clock;
  }

  /** A stand-in on 127.0.0.1, closed after the test. */
  async provider(options: StandInOptions = {}): Promise<ProviderStandIn> {
    const p = await startProviderStandIn(options);
    this.#standIns.push(p);
    return p;
  }

  /** The model spec of a stand-in. */
  model(p: ProviderStandIn, api: Api = 'openai-completions') {
    return {
      api,
      provider: 'stand-in',
      id: 'stand-in-1',
      baseUrl: api === 'openai-completions' ? p.url : p.anthropicUrl,
    };
  }

  /** An in-memory limiter on the test's clock (`maxConcurrent: 1` unless told), watched for held slots. */
  limiter<W extends string = 'default'>(options: Partial<ConcurrencyLimiterOptions<W>> = {}) {
    return this.watch(createConcurrencyLimiter<W>({ maxConcurrent: 1, clock: this.#clock, ...options }));
  }

  /** Watches a limiter the test built itself for slots left held or queued. */
  watch<L extends Watched>(limiter: L): L {
    this.#limiters.push(limiter);
    return limiter;
  }

  /** A controller whose signal a run gets; the guard checks that no listener is left on it. */
  controller(): AbortController {
    const controller = new AbortController();
    this.#signals.push(controller.signal);
    return controller;
  }

  /**
   * What the test left behind, one line per kind. A request aborted by the client takes a
   * turn or two to close at the stand-in, so in-flight requests get up to `settleMs` to do so.
   */
  async leaks({ settleMs = 2000 } = {}): Promise<string[]> {
    const found: string[] = [];
    for (const limiter of this.#limiters) {
      const stats = await limiter.stats?.();
      if (stats && (stats.active > 0 || stats.queued > 0)) {
        found.push(`limiter \`${limiter.name}\` has ${stats.active} slots held and ${stats.queued} queued`);
      }
    }
    for (const p of this.#standIns) {
      if (p.inFlight > 0) await until(() => p.inFlight === 0, { giveUpMs: settleMs }).catch(() => undefined);
      if (p.inFlight > 0) found.push(`the stand-in on port ${p.port} has ${p.inFlight} requests in flight`);
    }
    const timers = this.#clock.foregroundTimers;
    if (timers.length > 0) {
      found.push(
        `${timers.length} ManualClock timers pending (${timers.map((t) => `${t.ms} ms`).join(', ')})`,
      );
    }
    const listeners = this.#signals.reduce((sum, s) => sum + getEventListeners(s, 'abort').length, 0);
    if (listeners > 0) found.push(`${listeners} abort listeners on signals given to runs`);
    return found;
  }

  /** Closes the stand-ins and starts over with a fresh clock. */
  async close(): Promise<void> {
    for (const p of this.#standIns.splice(0)) await p.close();
    this.#limiters = [];
    this.#signals = [];
    this.#clock = new TestClock();
  }
}

/** Throws when the fixture reports a leak; what the `afterEach` of `useAgentFixture` runs. */
export async function guard(fixture: AgentFixture, options?: { settleMs?: number }): Promise<void> {
  const leaks = await fixture.leaks(options);
  if (leaks.length > 0) throw new Error(`Leak guard: the test left ${leaks.join('; ')}`);
}

/** One fixture for a test file, reset after each test, whose leaks fail that test. */
export function useAgentFixture(): AgentFixture {
  const fixture = new AgentFixture();
  afterEach(async () => {
    try {
      await guard(fixture);
    } finally {
      await fixture.close();
    }
  });
  return fixture;
}
