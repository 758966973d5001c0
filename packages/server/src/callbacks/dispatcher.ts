import { randomUUID } from 'node:crypto';
import { systemClock, type Clock, type ClockTimer } from 'sluice/concurrency';
import { screenCallbackUrl, systemResolver, type Resolver } from './destination.js';
import {
  resolveDispatcherOptions,
  type CallbackDispatcherOptions,
  type ResolvedDispatcherOptions,
} from './options.js';
import {
  claimDue,
  nextDueInMs,
  recordFinal,
  recordRetry,
  releaseClaim,
  type ClaimedDelivery,
} from './outbox.js';
import { postCallback } from './post.js';
import { judgeAttempt, retryDelayMs, type Verdict } from './retry.js';
import { signWebhook, tenantSigningSecret } from './signing.js';

/**
 * The dispatcher's life:
 *
 *   new ──start()──► running ──stop()──► stopping ──(attempts done, or stopTimeoutMs)──► stopped
 *
 * While running it polls: claim due rows up to the free slots, start one attempt per row
 * (outside any transaction), and sleep until the next row is due, at most pollIntervalMs.
 * `notify()` and every finished attempt poll at once. The rows are the whole state: a
 * process that stops or dies mid-attempt leaves its rows leased, and any process delivers
 * them once the lease ends.
 */
type DispatcherState = 'new' | 'running' | 'stopping' | 'stopped';

interface Attempt {
  readonly done: Promise<void>;
  readonly abort: AbortController;
}

/** A due row that could not be claimed (another process holds it) is looked at again this soon. */
const busyRetryMs = 100;

/**
 * Delivers run callbacks from the `callback_deliveries` outbox: signed (Standard Webhooks),
 * bounded in concurrency, retried with backoff for a bounded time, never to a forbidden
 * address, and shared safely by every server process on the database.
 *
 * @example
 * const callbacks = new CallbackDispatcher({
 *   db: store.db,
 *   renderRun: async (id, tenant) => { const run = await getRun(store.db, tenant, id); return run && present(run); },
 *   allowPrivate: process.env.SLUICE_CALLBACK_ALLOW_PRIVATE === '1',
 * });
 * callbacks.start();
 * // when the outbox announces a delivery ('callback:<run id>' on sluice_runs): callbacks.notify();
 * // on shutdown: await callbacks.stop();
 */
export class CallbackDispatcher {
  readonly #options: ResolvedDispatcherOptions;
  readonly #clock: Clock;
  readonly #resolver: Resolver;
  #state: DispatcherState = 'new';
  readonly #attempts = new Map<string, Attempt>();
  #timer: ClockTimer | undefined;
  /** The poll in progress (or the last one), for stop() to wait on. */
  #polling: Promise<void> | undefined;
  #pollBusy = false;
  #pollAgain = false;
  #stopping: Promise<void> | undefined;

  constructor(options: CallbackDispatcherOptions) {
    this.#options = resolveDispatcherOptions(options);
    this.#clock = this.#options.clock ?? systemClock;
    this.#resolver = this.#options.lookup ?? systemResolver;
  }

  /** Attempts in flight in this process. */
  get inFlight(): number {
    return this.#attempts.size;
  }

  /** Starts polling. Calling it again does nothing; after `stop()` it throws. */
  start(): void {
    if (this.#state === 'running') return;
    if (this.#state !== 'new') throw new Error(`Cannot start a callback dispatcher that is ${this.#state}`);
    this.#state = 'running';
    this.#poll();
  }

  /** A delivery may be due (the outbox announced one): look now, not at the next poll. */
  notify(): void {
    this.#poll();
  }

  /**
   * Stops claiming, waits up to `stopTimeoutMs` for the attempts in flight, then abandons
   * the rest: their rows stay leased and are delivered after the lease, by any process.
   */
  stop(): Promise<void> {
    this.#stopping ??= this.#stop();
    return this.#stopping;
  }

  async #stop(): Promise<void> {
    const wasRunning = this.#state === 'running';
    this.#state = 'stopping';
    this.#cancelTimer();
    // The bound starts when stop() is called (before any await), whatever is in flight.
    let timer: ClockTimer | undefined;
    const bound = new Promise<'timeout'>((resolve) => {
      timer = this.#clock.setTimeout(() => resolve('timeout'), this.#options.stopTimeoutMs);
    });
    // A claim in progress may still start nothing (it hands its rows back), but the attempts
    // it may have begun just before are only known once it is done.
    const settled = async () => {
      if (wasRunning) await this.#polling;
      await Promise.all([...this.#attempts.values()].map((a) => a.done));
    };
    const result = await Promise.race([settled().then(() => 'done' as const), bound]);
    this.#clock.clearTimeout(timer!);
    if (result === 'timeout') {
      for (const attempt of this.#attempts.values()) attempt.abort.abort();
      await Promise.all([...this.#attempts.values()].map((a) => a.done));
    }
    this.#state = 'stopped';
  }

  #poll(): void {
    if (this.#state !== 'running') return;
    if (this.#pollBusy) {
      this.#pollAgain = true;
      return;
    }
    this.#pollBusy = true;
    this.#polling = this.#pollOnce();
  }

  async #pollOnce(): Promise<void> {
    const o = this.#options;
    this.#cancelTimer();
    let nextPollMs = o.pollIntervalMs;
    try {
      do {
        this.#pollAgain = false;
        const free = o.concurrency - this.#attempts.size;
        let claimed: ClaimedDelivery[] = [];
        const lease = randomUUID();
        if (free > 0) {
          claimed = await claimDue(o.db, { limit: free, lease, leaseMs: o.leaseMs, now: this.#sqlNow() });
        }
        if (claimed.length > 0) {
          if (this.#state !== 'running') {
            // stop() came while claiming: hand the rows back untried rather than sit on them.
            await releaseClaim(o.db, { lease, now: this.#sqlNow() });
            break;
          }
          o.log({ type: 'claimed', ids: claimed.map((r) => r.id) });
          for (const row of claimed) this.#begin(row, lease);
        }
        if (claimed.length < free) {
          const due = await nextDueInMs(o.db, this.#sqlNow());
          nextPollMs =
            due === null
              ? o.pollIntervalMs
              : Math.min(o.pollIntervalMs, Math.max(Math.ceil(due), due <= 0 ? busyRetryMs : 0));
        }
      } while (this.#pollAgain && this.#state === 'running');
    } catch (error) {
      // A database fault must not stop deliveries for good, nor crash the process.
      o.log({ type: 'error', during: 'poll', error });
      nextPollMs = o.pollRetryMs;
    }
    // Cleared with no await since the loop's last check of #pollAgain, so a notify() that
    // comes in now starts a new poll instead of being lost.
    this.#pollBusy = false;
    if (this.#state !== 'running') return;
    this.#timer = this.#clock.setTimeout(() => this.#poll(), nextPollMs, { background: true });
    o.log({ type: 'idle', inFlight: this.#attempts.size, nextPollMs });
  }

  #begin(row: ClaimedDelivery, lease: string): void {
    const abort = new AbortController();
    const done = this.#deliver(row, lease, abort.signal)
      .catch((error: unknown) => this.#options.log({ type: 'error', during: 'record', error }))
      .finally(() => {
        this.#attempts.delete(row.id);
        // A slot is free: fill it now rather than at the next poll.
        this.#poll();
      });
    this.#attempts.set(row.id, { done, abort });
  }

  async #deliver(row: ClaimedDelivery, lease: string, signal: AbortSignal): Promise<void> {
    const o = this.#options;
    let verdict: Verdict;
    try {
      verdict = await this.#attempt(row, signal);
    } catch (error) {
      // Our side failed (the database, rendering): not the receiver's fault, so try again.
      verdict = {
        kind: 'retry',
        status: null,
        reason: `internal: ${error instanceof Error ? error.message : String(error)}`,
      };
    }
    if (signal.aborted) {
      o.log({ type: 'abandoned', id: row.id, runId: row.run_id });
      return;
    }
    const base = { id: row.id, runId: row.run_id, attempts: row.attempts };
    const now = this.#sqlNow();
    if (verdict.kind === 'retry') {
      const delayMs = retryDelayMs(row.attempts, o, o.random, verdict.retryAfterMs);
      const state = await recordRetry(o.db, {
        id: row.id,
        lease,
        status: verdict.status,
        error: verdict.reason,
        delayMs,
        maxAgeMs: o.maxAgeMs,
        now,
      });
      if (state === 'pending')
        o.log({ type: 'retry', ...base, reason: verdict.reason, status: verdict.status, delayMs });
      if (state === 'dead') o.log({ type: 'dead', ...base, reason: verdict.reason, status: verdict.status });
      return;
    }
    const recorded = await recordFinal(o.db, {
      id: row.id,
      lease,
      state: verdict.kind,
      status: verdict.status,
      error: verdict.kind === 'failed' ? verdict.reason : null,
      now,
    });
    if (!recorded) return;
    if (verdict.kind === 'delivered') o.log({ type: 'delivered', ...base, status: verdict.status });
    else o.log({ type: 'failed', ...base, reason: verdict.reason, status: verdict.status });
  }

  /** One attempt: render, check the destination again, sign, POST, judge. */
  async #attempt(row: ClaimedDelivery, signal: AbortSignal): Promise<Verdict> {
    const o = this.#options;
    const screened = screenCallbackUrl(row.url, o.allowPrivate);
    if (!screened.ok) return { kind: 'failed', status: null, reason: screened.message };
    const run = await o.renderRun(row.run_id, row.tenant);
    if (run === undefined) return { kind: 'failed', status: null, reason: 'the run no longer exists' };
    const body = JSON.stringify(run);
    const secret = await tenantSigningSecret(o.db, row.tenant);
    // A fresh timestamp per attempt, so a retry a day later is still within the receiver's tolerance.
    const timestamp = Math.floor(this.#clock.now() / 1000);
    const headers = {
      'content-type': 'application/json',
      'user-agent': 'sluice',
      'webhook-id': row.id,
      'webhook-timestamp': String(timestamp),
      'webhook-signature': signWebhook(secret, row.id, timestamp, body),
    };
    const outcome = await postCallback(screened.url, headers, body, {
      timeoutMs: o.attemptTimeoutMs,
      resolver: this.#resolver,
      allowPrivate: o.allowPrivate,
      clock: this.#clock,
      signal,
    });
    if (outcome.kind === 'aborted') return { kind: 'retry', status: null, reason: 'stopped' };
    return judgeAttempt(outcome, this.#clock.now());
  }

  /** The time for SQL: the injected clock's, or null for the database's own. */
  #sqlNow(): number | null {
    return this.#options.clock ? this.#options.clock.now() : null;
  }

  #cancelTimer(): void {
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}
