/**
 * A worker process for the crash and start-up tests.
 *
 * Env: PG (JSON connection settings), SCHEMA, LIMITER, LIMITS (JSON options), MODE:
 * - `start`: at START_AT (epoch ms), make the limiter (creating the schema if need be), take and give back one slot,
 *   print `ok`, exit; print the error's class and message and exit 1 if that fails;
 * - `hold`: take a slot, print the lease as JSON, and never let go (nor renew);
 * - `wait`: print `waiting`, ask for a slot (of WORKLOAD), print `granted <epoch ms>` when it
 *   comes; then hold it forever, or for HOLD_MS and exit.
 */
import pg from 'pg';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';

const pool = new pg.Pool({ ...JSON.parse(process.env.PG!), max: 3 });
const limiter = createPostgresConcurrencyLimiter<string>({
  ...JSON.parse(process.env.LIMITS ?? '{"maxConcurrent":1}'),
  db: pool,
  schema: process.env.SCHEMA!,
  name: process.env.LIMITER!,
});

switch (process.env.MODE) {
  case 'start':
    // All workers of a start-up race begin at the same wall-clock moment, connections open.
    await pool.query('SELECT 1');
    await new Promise((r) => setTimeout(r, Math.max(0, Number(process.env.START_AT ?? 0) - Date.now())));
    try {
      await limiter.release(await limiter.acquire({ timeoutMs: 30_000 }));
      console.log('ok');
    } catch (error) {
      console.log(`${(error as Error).name}: ${(error as Error).message}`);
      process.exitCode = 1;
    }
    await limiter.close();
    await pool.end();
    break;
  case 'hold': {
    const lease = await limiter.acquire();
    console.log(JSON.stringify(lease));
    setInterval(() => undefined, 1 << 30);
    break;
  }
  case 'wait': {
    console.log('waiting');
    const lease = await limiter.acquire({ workload: process.env.WORKLOAD });
    console.log(`granted ${Date.now()}`);
    if (process.env.HOLD_MS === undefined) {
      setInterval(() => undefined, 1 << 30);
      break;
    }
    await new Promise((r) => setTimeout(r, Number(process.env.HOLD_MS)));
    await limiter.release(lease);
    await limiter.close();
    await pool.end();
    break;
  }
}
