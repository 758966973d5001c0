/**
 * Sluice in bench:queues: the run server as a user starts it (`serve`), one agent calling the
 * stand-in, deferred runs with the tenant caps on. Answers `ready` with a token per tenant.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve, tuneHeap } from '@sluice/server';
import { answerParent, childOptions, failStart } from './child.js';
import { inputOf, type SystemOptions, type SystemReady } from './options.js';

// As `sluice serve` does when it starts (heap-tuning.ts).
tuneHeap();
const options = childOptions<SystemOptions>();
const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-queues-'));
try {
  const model = {
    api: 'openai-completions' as const,
    provider: 'stand-in',
    id: 'm',
    baseUrl: options.providerUrl,
  };
  const server = await serve({
    config: defineConfig({
      agents: { model: createAgent({ model, credentials: { apiKey: 'k' } }) },
      settings: {
        deferredConcurrency: options.workers,
        // Without a cap to measure, the cap is the workers: checked on every claim all the same.
        deferredMaxRunningPerTenant: options.tenantCap || options.workers,
        deferredMaxQueuedPerTenant: 1_000_000,
      },
    }),
    port: 0,
    host: '127.0.0.1',
    dataDir: dir,
    databaseUrl: options.databaseUrl,
    logger: false,
  });
  const ready: SystemReady = {
    url: `${server.url}/api/client/v1/agents/model/runs`,
    headers: {},
    bodies: {},
    status: 202,
  };
  for (const tenant of options.tenants) {
    const token = await createToken(server.store.db, { tenant, project: 'p', user: 'u', role: 'member' });
    ready.headers[tenant] = { 'content-type': 'application/json', authorization: `Bearer ${token.secret}` };
    ready.bodies[tenant] = JSON.stringify({ input: inputOf(tenant), class: 'deferred', wait: false });
  }
  answerParent(
    { ...ready },
    {
      stop: async () => {
        await server.close();
        rmSync(dir, { recursive: true, force: true });
      },
    },
  );
} catch (error) {
  rmSync(dir, { recursive: true, force: true });
  failStart(error);
}
