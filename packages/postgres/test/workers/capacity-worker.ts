/**
 * A worker process for the capacity tests across processes (budgets and the provider's pause).
 *
 * Env: PG (JSON connection settings), SCHEMA, LIMITER, LIMITS (JSON options), MODE:
 * - `spend`: prints `ready` once the limiter is ready and waits for `go` on stdin (so every
 *   process starts spending at the same moment, however slow its start-up was); then LOOPS
 *   concurrent loops take slots with random token estimates (100 to 400 input tokens) until
 *   the process has asked for SPEND_TOKENS in all, and give each back at once without usage (the estimate
 *   stays charged); prints one JSON line per grant, `{ "tokens", "at", "fence" }` (`at`: the
 *   lease's acquiredAt, the database time its tokens left the buckets), then `done`;
 * - `hold`: takes a slot, prints `held`, then waits for one line on stdin, `release <status>
 *   <retryAfterMs>`, releases with that provider answer, prints `released`, and exits;
 * - `wait`: prints `waiting`, asks for a slot, prints `granted <acquiredAt>`, gives it back, exits.
 */
import { createInterface } from 'node:readline';
import pg from 'pg';
import { createPostgresConcurrencyLimiter } from '@sluice/postgres';

const pool = new pg.Pool({ ...JSON.parse(process.env.PG!), max: 6 });
const limiter = createPostgresConcurrencyLimiter<string>({
  ...JSON.parse(process.env.LIMITS!),
  db: pool,
  schema: process.env.SCHEMA!,
  name: process.env.LIMITER!,
});

async function lineFromStdin(expected: string): Promise<void> {
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) if (line.trim() === expected) break;
  lines.close();
}

async function spend(): Promise<void> {
  await limiter.ready();
  console.log('ready');
  await lineFromStdin('go');
  // An amount, not a time: however slow the machine, the processes together ask for more than
  // the bucket holds, so the budget binds and the refill is used.
  const target = Number(process.env.SPEND_TOKENS);
  let asked = 0;
  const loop = async () => {
    while (asked < target) {
      // The last one asks only for what is left: the processes take exactly SPEND_TOKENS each.
      const tokens = Math.min(100 + Math.floor(Math.random() * 301), target - asked);
      asked += tokens;
      const lease = await limiter.acquire({ tokens: { input: tokens }, timeoutMs: 60_000 });
      console.log(JSON.stringify({ tokens, at: lease.acquiredAt, fence: lease.fence }));
      await limiter.release(lease);
    }
  };
  await Promise.all(Array.from({ length: Number(process.env.LOOPS ?? 4) }, loop));
  console.log('done');
}

async function hold(): Promise<void> {
  const lease = await limiter.acquire();
  console.log('held');
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [command, status, retryAfterMs] = line.trim().split(' ');
    if (command !== 'release') continue;
    await limiter.release(lease, {
      provider: { status: Number(status), retryAfterMs: Number(retryAfterMs) },
    });
    console.log('released');
    break;
  }
  lines.close();
}

async function wait(): Promise<void> {
  console.log('waiting');
  const lease = await limiter.acquire();
  console.log(`granted ${lease.acquiredAt}`);
  await limiter.release(lease);
}

switch (process.env.MODE) {
  case 'spend':
    await spend();
    break;
  case 'hold':
    await hold();
    break;
  case 'wait':
    await wait();
    break;
  default:
    throw new Error(`unknown MODE ${process.env.MODE}`);
}
await limiter.close();
await pool.end();
