/**
 * One worker process of bench/capacity: LOOPS agent loops, each running one agent run after
 * another against the stand-in, through the limiter of the configuration the bench names.
 * Driven over the IPC channel: `prepare` (build the limiter, answer `prepared`), `start`
 * (run until `stopAt`, answer `result`), `exit`.
 */
import { setMaxListeners } from 'node:events';
import pg from 'pg';
import {
  createAgent,
  createConcurrencyLimiter,
  type ConcurrencyLimiter,
  type ConcurrencyLimiterOptions,
} from 'sluice';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { endPool } from '../../scripts/postgres-config.js';
import { account, outputCap, type Configuration } from './configurations.js';
import { CountAfterLimiter } from './count-after-limiter.js';
import { promptSource } from './prompts.js';

export type ToWorker =
  | { type: 'prepare'; configuration: Configuration; providerUrl: string; limiterName: string }
  | { type: 'start'; startAt: number; stopAt: number }
  | { type: 'exit' };

export interface WorkerResult {
  type: 'result';
  /** Run latencies (ms) of the runs that ended by themselves, in the order they ended. */
  latencies: number[];
  /** Runs that failed (the provider's error after the retries, a limiter wait that timed out). */
  failed: number;
  /** The failures by message, for the bench's notes. */
  failures: Record<string, number>;
  /** The limiter's effective limit when the window ended, if its stats give one. */
  limit: number | undefined;
}

const processIndex = Number(process.env.PROCESS_INDEX);
const loops = Number(process.env.LOOPS);
/** `memory`: Sluice's limiters in this process only (the bench then runs one worker). */
const inMemory = process.env.LIMITER === 'memory';
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 6 });
// An idle connection whose backend is terminated reports it here; the worker goes on.
pool.on('error', (error) => console.error(`worker ${processIndex} pool: ${error.message}`));

let current: {
  configuration: Configuration;
  limiter: ConcurrencyLimiter<string> | undefined;
  providerUrl: string;
};

/** A Sluice limiter of these options: on PostgreSQL, shared by every worker, or in this process. */
function sluiceLimiter(name: string, options: ConcurrencyLimiterOptions): ConcurrencyLimiter<string> {
  if (inMemory) return createConcurrencyLimiter({ ...options, name });
  return createPostgresConcurrencyLimiter({ ...options, db: pool, schema: 'bench_capacity', name });
}

async function limiterFor(
  configuration: Configuration,
  name: string,
): Promise<ConcurrencyLimiter<string> | undefined> {
  switch (configuration) {
    case 'slots_only':
      return sluiceLimiter(name, { maxConcurrent: account.maxConcurrent });
    case 'no_limiter':
      return undefined;
    case 'count_after':
      return CountAfterLimiter.open(pool, {
        name,
        tokensPerMinute: account.tokensPerMinute,
        requestsPerMinute: account.requestsPerMinute,
        maxParallel: account.maxConcurrent,
      });
    case 'sluice':
      return sluiceLimiter(name, { maxConcurrent: 64, adaptive: true });
    case 'told':
      return sluiceLimiter(name, {
        maxConcurrent: account.maxConcurrent,
        rate: { requestsPerMinute: account.requestsPerMinute, tokensPerMinute: account.tokensPerMinute },
      });
  }
}

async function run(startAt: number, stopAt: number): Promise<WorkerResult> {
  const agent = createAgent({
    model: {
      api: 'openai-completions',
      provider: 'stand-in',
      id: 'bench-model',
      baseUrl: current.providerUrl,
      maxTokens: outputCap,
    },
    credentials: { apiKey: 'bench' },
    instructions: 'You summarise the documents you are given.',
    ...(current.limiter ? { concurrency: { limiter: current.limiter } } : {}),
  });
  const stop = new AbortController();
  // Every run of the loops listens to it.
  setMaxListeners(4 * loops, stop.signal);
  const result: WorkerResult = { type: 'result', latencies: [], failed: 0, failures: {}, limit: undefined };
  await new Promise((r) => setTimeout(r, Math.max(0, startAt - Date.now())));
  const stopTimer = setTimeout(
    () => stop.abort(new Error('the window ended')),
    Math.max(0, stopAt - Date.now()),
  );
  await Promise.all(
    Array.from({ length: loops }, async (_, loop) => {
      const next = promptSource(processIndex * 1_000 + loop);
      while (!stop.signal.aborted) {
        const t0 = performance.now();
        try {
          await agent.run({ prompt: next(), signal: stop.signal });
          // A run that ended after the window is not counted: its figures belong to no window.
          if (!stop.signal.aborted) result.latencies.push(performance.now() - t0);
        } catch (error) {
          if (stop.signal.aborted) break;
          result.failed++;
          const message = error instanceof Error ? error.message.slice(0, 120) : String(error);
          result.failures[message] = (result.failures[message] ?? 0) + 1;
        }
      }
    }),
  );
  clearTimeout(stopTimer);
  const stats = await current.limiter?.stats?.();
  result.limit = stats?.limit;
  await (current.limiter as { close?: () => Promise<void> } | undefined)?.close?.();
  return result;
}

process.on('message', (message: ToWorker) => {
  void (async () => {
    if (message.type === 'prepare') {
      // A limiter that refuses its options (a build of @sluice/postgres without budgets, say)
      // is reported, and the bench goes on without this configuration.
      try {
        const limiter = await limiterFor(message.configuration, message.limiterName);
        await (limiter as { ready?: () => Promise<void> } | undefined)?.ready?.();
        current = { configuration: message.configuration, limiter, providerUrl: message.providerUrl };
        process.send!({ type: 'prepared' });
      } catch (error) {
        process.send!({ type: 'prepared', error: error instanceof Error ? error.message : String(error) });
      }
    } else if (message.type === 'start') {
      process.send!(await run(message.startAt, message.stopAt));
    } else {
      await endPool(pool);
      process.disconnect();
    }
  })().catch((error: unknown) => {
    console.error(error);
    process.exit(1);
  });
});
process.send!({ type: 'up' });
