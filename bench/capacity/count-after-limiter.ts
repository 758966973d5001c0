/**
 * A token limiter the way LiteLLM counts (research note §2.2 and §2.3; BerriAI/litellm#18730):
 * before a request it checks what the current minute has used against the budget; the tokens
 * are added only after the response, from its usage. The request and parallel counters are
 * taken atomically before the request (LiteLLM increments those before the call, in Redis or
 * a Lua script), so the one thing that differs from Sluice's budgets is the count-after: a
 * request in flight has spent nothing yet, so every request that starts while others are
 * running sees room that those others are about to use.
 *
 * Shared through PostgreSQL by every process, as LiteLLM shares through Redis: one row per
 * limiter and calendar minute (LiteLLM's `{key}::{minute}` keys), and one row of the
 * requests in flight. A request that finds no room waits and checks again, as a LiteLLM
 * client retries the 429 it is answered.
 */
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type {
  AcquireRequest,
  ConcurrencyLease,
  ConcurrencyLimiter,
  ReleaseDetails,
} from 'sluice/concurrency';

const MINUTE = 60_000;

export interface CountAfterOptions {
  name: string;
  tokensPerMinute: number;
  requestsPerMinute: number;
  /** LiteLLM's `max_parallel_requests`. */
  maxParallel: number;
  /** How long a request that found no room waits before it checks again. @default 250 */
  retryMs?: number;
}

export class CountAfterLimiter implements ConcurrencyLimiter<string> {
  readonly name: string;
  readonly #pool: pg.Pool;
  readonly #options: Required<CountAfterOptions>;

  private constructor(pool: pg.Pool, options: CountAfterOptions) {
    this.name = options.name;
    this.#pool = pool;
    this.#options = { retryMs: 250, ...options };
  }

  /** Creates the two tables if they are missing (every process may call it). */
  static async open(pool: pg.Pool, options: CountAfterOptions): Promise<CountAfterLimiter> {
    const client = await pool.connect();
    try {
      await client.query('SELECT pg_advisory_lock(4242)');
      await client.query(`CREATE TABLE IF NOT EXISTS count_after_minutes (
        name text NOT NULL, minute bigint NOT NULL, requests int NOT NULL DEFAULT 0,
        tokens bigint NOT NULL DEFAULT 0, PRIMARY KEY (name, minute))`);
      await client.query(`CREATE TABLE IF NOT EXISTS count_after_parallel (
        name text PRIMARY KEY, active int NOT NULL DEFAULT 0)`);
      await client.query('INSERT INTO count_after_parallel (name) VALUES ($1) ON CONFLICT DO NOTHING', [
        options.name,
      ]);
      await client.query('SELECT pg_advisory_unlock(4242)');
    } finally {
      client.release();
    }
    return new CountAfterLimiter(pool, options);
  }

  async acquire(request: AcquireRequest<string> = {}): Promise<ConcurrencyLease<string>> {
    for (;;) {
      request.signal?.throwIfAborted();
      if (await this.#tryGrant()) {
        const now = Date.now();
        return {
          id: randomUUID(),
          limiter: this.name,
          workload: 'default',
          acquiredAt: now,
          expiresAt: now + MINUTE,
        };
      }
      await sleep(this.#options.retryMs * (0.5 + Math.random()), request.signal);
    }
  }

  /** Nothing expires here: a lease is renewed as it is. */
  async renew(lease: ConcurrencyLease<string>): Promise<ConcurrencyLease<string>> {
    return { ...lease, expiresAt: Date.now() + MINUTE };
  }

  /** Adds the response's usage to the minute it ended in, and frees the parallel place. */
  async release(_lease: ConcurrencyLease<string>, details?: ReleaseDetails): Promise<void> {
    const usage = details?.usage;
    const tokens = (usage?.input ?? 0) + (usage?.output ?? 0);
    await this.#pool.query(
      'UPDATE count_after_parallel SET active = greatest(active - 1, 0) WHERE name = $1',
      [this.name],
    );
    if (tokens > 0)
      await this.#pool.query(
        `INSERT INTO count_after_minutes (name, minute, tokens) VALUES ($1, $2, $3)
         ON CONFLICT (name, minute) DO UPDATE SET tokens = count_after_minutes.tokens + EXCLUDED.tokens`,
        [this.name, Math.floor(Date.now() / MINUTE), tokens],
      );
  }

  /**
   * The pre-call check, atomic for the counters taken before the call: under the parallel
   * row's lock, the minute's tokens so far (only finished requests) and requests are read and,
   * when both are under their budgets and a parallel place is free, a request is counted.
   */
  async #tryGrant(): Promise<boolean> {
    const client = await this.#pool.connect();
    try {
      await client.query('BEGIN');
      const minute = Math.floor(Date.now() / MINUTE);
      const parallel = await client.query<{ active: number }>(
        'SELECT active FROM count_after_parallel WHERE name = $1 FOR UPDATE',
        [this.name],
      );
      const used = await client.query<{ requests: number; tokens: string }>(
        'SELECT requests, tokens FROM count_after_minutes WHERE name = $1 AND minute = $2',
        [this.name, minute],
      );
      const requests = used.rows[0]?.requests ?? 0;
      const tokens = Number(used.rows[0]?.tokens ?? 0);
      const o = this.#options;
      const room =
        parallel.rows[0]!.active < o.maxParallel &&
        requests < o.requestsPerMinute &&
        tokens < o.tokensPerMinute;
      if (room) {
        await client.query('UPDATE count_after_parallel SET active = active + 1 WHERE name = $1', [
          this.name,
        ]);
        await client.query(
          `INSERT INTO count_after_minutes (name, minute, requests) VALUES ($1, $2, 1)
           ON CONFLICT (name, minute) DO UPDATE SET requests = count_after_minutes.requests + 1`,
          [this.name, minute],
        );
      }
      await client.query('COMMIT');
      return room;
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  }
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener('abort', abort);
      resolve();
    }
    function abort() {
      clearTimeout(timer);
      reject(signal!.reason as Error);
    }
    signal?.addEventListener('abort', abort, { once: true });
  });
}
