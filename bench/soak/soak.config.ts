/**
 * The config of the soak's `sluice serve` processes: one agent, `soak`, on a limiter shared
 * through the soak's PostgreSQL (behind PgBouncer, so `listen: false`), against the provider
 * stand-in of the soak's own process. Its one tool, `mark`, tells the soak's receiver which
 * run executed it in which process: a run executed twice shows as two marks.
 */
import pg from 'pg';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';
import { fromPgPool } from '@sluice/postgres/database';
import { createAgent, tool } from 'sluice';
import type { SluiceConfig } from '@sluice/server';

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`The soak's config needs ${name}`);
  return value;
};

// query_timeout: a connection stalled by the soak's proxy would hold a limiter's statement for
// ever (docs/postgres.md); this ends it, and the pool drops the connection.
const pool = new pg.Pool({
  connectionString: env('DATABASE_URL'),
  max: 4,
  connectionTimeoutMillis: 5000,
  query_timeout: 10_000,
});
pool.on('error', () => undefined);

export const SOAK_LIMIT = Number(env('SOAK_LIMIT'));

const limiter = createPostgresConcurrencyLimiter({
  // Behind PgBouncer a client that went silent mid-transaction leaves its server session idle
  // in that transaction, holding the limiter's row locks, for as long as PgBouncer keeps it:
  // each transaction bounds that itself, as the server's store does (docs/deploy.md).
  db: fromPgPool(pool, {
    transactionSettings: {
      idle_in_transaction_session_timeout: '5000ms',
      lock_timeout: '5000ms',
      statement_timeout: '5000ms',
    },
  }),
  name: 'soak',
  maxConcurrent: SOAK_LIMIT,
  listen: false,
  pollIntervalMs: 100,
  workloads: { interactive: { reserved: 1, priority: 10 }, background: {} },
});

const receiver = env('SOAK_RECEIVER_URL');

const mark = tool({
  name: 'mark',
  description: 'Records that this run executed.',
  parameters: { type: 'object', properties: { token: { type: 'string' } }, required: ['token'] },
  async execute(args: { token: string }, context) {
    const startedAt = Date.now();
    const response = await fetch(`${receiver}/executed`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ runId: context.runId, token: args.token, pid: process.pid, startedAt }),
      signal: context.signal,
    });
    return response.ok ? 'marked' : `not marked: ${response.status}`;
  },
});

const config: SluiceConfig = {
  agents: {
    soak: createAgent({
      model: { api: 'openai-completions', provider: 'stand-in', id: 'soak', baseUrl: env('PROVIDER_URL') },
      credentials: { apiKey: 'soak' },
      tools: [mark],
      concurrency: { limiter, workload: 'interactive', outputTokens: 20 },
      retry: { maxRetries: 4, baseDelayMs: 100, maxDelayMs: 1000 },
    }),
  },
  classes: { default: { workload: 'interactive' }, deferred: { workload: 'background' } },
  tenants: { t3: { maxConcurrentAgentRuns: 3 } },
  cacheStore: 'redis',
  close: async () => {
    await limiter.close();
    await pool.end();
  },
};
export default config;
