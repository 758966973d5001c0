/**
 * Peak memory of one agent turn with 300 tool calls, with the default cap of 10 parallel
 * tool calls and with the cap lifted (300), each in a fresh process so the peaks do not mix.
 * Each tool holds a 1 MB buffer while it runs, standing in for per-call working state.
 *
 * Run: npm run bench:memory
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';

if (process.env.SLUICE_MEMORY_CHILD) {
  const cap = Number(process.env.SLUICE_MEMORY_CHILD);
  const provider = await startProviderStandIn({
    reply: toolThenAnswer(() =>
      Array.from({ length: 300 }, (_, i) => ({ name: 'work', arguments: { n: i } })),
    ),
  });
  let peakRss = process.memoryUsage().rss;
  const sample = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 2);
  const agent = createAgent({
    model: { api: 'openai-completions', provider: 'stand-in', id: 'm', baseUrl: provider.url },
    credentials: { apiKey: 'k' },
    bounds: { maxParallelToolCalls: cap },
    tools: [
      tool<{ n: number }>({
        name: 'work',
        description: 'works',
        parameters: { type: 'object', properties: { n: { type: 'number' } }, required: ['n'] },
        execute: async ({ n }) => {
          const state = Buffer.alloc(1024 * 1024, n);
          await new Promise((r) => setTimeout(r, 20));
          return state[0];
        },
      }),
    ],
  });
  const before = process.memoryUsage().rss;
  await agent.run({ prompt: 'go' });
  peakRss = Math.max(peakRss, process.memoryUsage().rss);
  clearInterval(sample);
  await provider.close();
  console.log(JSON.stringify({ before, peakRss }));
} else {
  const self = fileURLToPath(import.meta.url);
  const measure = (cap: number) => {
    const out = spawnSync(process.execPath, ['--conditions=@sluice/source', '--import', 'tsx', self], {
      env: { ...process.env, SLUICE_MEMORY_CHILD: String(cap) },
      encoding: 'utf8',
    });
    if (out.status !== 0) throw new Error(out.stderr);
    return JSON.parse(out.stdout.trim().split('\n').at(-1)!) as { before: number; peakRss: number };
  };
  const mb = (n: number) => `${(n / 1024 / 1024).toFixed(0)} MB`;
  const capped = measure(10);
  const lifted = measure(300);
  console.log('\nOne turn with 300 tool calls, each holding 1 MB while it runs (peak RSS of the process)\n');
  console.log('| tool calls at once | peak RSS | growth during the turn |');
  console.log('|---|---|---|');
  console.log(`| 10 (default cap) | ${mb(capped.peakRss)} | ${mb(capped.peakRss - capped.before)} |`);
  console.log(`| 300 (cap lifted) | ${mb(lifted.peakRss)} | ${mb(lifted.peakRss - lifted.before)} |`);
}
