/**
 * The servers bench:server measures, in a process of their own (the load generator is the
 * bench's main process): for `admission`, the bare Fastify route and the run server on one
 * store, its model stalled; for `isolation`, a run server whose model answers inline runs at
 * once and stalls the batch ones. Answers `ready` with the URLs and a member's token;
 * `backlog` counts the tenant's deferred runs queued or running; `stop` closes everything.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Fastify from 'fastify';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve, type ServerSettings } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';
import { answerParent, childOptions, failStart } from '../queues/child.js';

const { mode, databaseUrl } = childOptions<{ mode: 'admission' | 'isolation'; databaseUrl: string }>();
const tenant = mode === 'admission' ? 'bench' : 'iso';
const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-server-'));
try {
  const bare = Fastify();
  bare.post('/constant', async () => ({ ok: true }));
  const bareUrl = await bare.listen({ port: 0, host: '127.0.0.1' });
  const provider = await startProviderStandIn({
    reply: (r) => {
      if (mode === 'admission') return { stall: true };
      const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
      return last.startsWith('batch') ? { stall: true } : { text: 'ok' };
    },
  });
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const settings: Partial<ServerSettings> =
    mode === 'admission'
      ? { maxActivePerTenant: 1, deferredMaxQueuedPerTenant: 0, deferredConcurrency: 1 }
      : {};
  const server = await serve({
    config: defineConfig({
      agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) },
      settings,
    }),
    port: 0,
    host: '127.0.0.1',
    dataDir: dir,
    databaseUrl,
    // No request log, as on the bare route: the figure is the cost of admission, not of logging.
    logger: false,
  });
  const token = (await createToken(server.store.db, { tenant, project: 'p', user: 'u', role: 'member' }))
    .secret;
  answerParent(
    { bareUrl: `${bareUrl}/constant`, runsUrl: `${server.url}/api/client/v1/agents/echo/runs`, token },
    {
      backlog: async () => {
        const { rows } = await server.store.db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM agent_runs
            WHERE tenant = $1 AND class = 'deferred' AND status IN ('queued', 'running')`,
          [tenant],
        );
        return { backlog: rows[0]!.n };
      },
      stop: async () => {
        await server.close();
        await provider.close();
        await bare.close();
        rmSync(dir, { recursive: true, force: true });
      },
    },
  );
} catch (error) {
  rmSync(dir, { recursive: true, force: true });
  failStart(error);
}
