/**
 * The bench's run server, in a process of its own: one gateway in front of the stand-in at
 * `UPSTREAM`, on a limiter wide enough that no request waits (the bench measures the gateway's
 * own cost, not queueing), embedded PGlite in a temporary folder, logs off.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createAgent, createConcurrencyLimiter } from 'sluice';
import { createToken, defineConfig, serve, tuneHeap } from '@sluice/server';
import { answerBench } from './child.js';

// As `sluice serve` does when it starts (heap-tuning.ts).
tuneHeap();
const upstream = process.env.UPSTREAM!;
const limiter = createConcurrencyLimiter({ name: 'bench', maxConcurrent: 1_024 });
const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-gateway-'));
const server = await serve({
  config: defineConfig({
    agents: {
      echo: createAgent({
        model: { api: 'openai-completions', provider: 'stand-in', id: 'm', baseUrl: upstream },
        credentials: { apiKey: 'bench' },
        concurrency: { limiter },
      }),
    },
    gateways: { openai: { api: 'openai', upstream, limiter, apiKey: 'sk-bench-upstream' } },
  }),
  port: 0,
  dataDir: dir,
  databaseUrl: '',
  logger: false,
});
const { secret } = await createToken(server.store.db, {
  tenant: 'bench',
  project: 'p',
  user: 'u',
  role: 'member',
});
answerBench({ url: server.url, token: secret }, async () => {
  await server.close();
  rmSync(dir, { recursive: true, force: true });
});
