/**
 * Peak memory of one agent turn with 300 tool calls, with the default cap of 10 parallel
 * tool calls and with the cap lifted (300), each in a fresh process so the peaks do not mix.
 * Each tool holds a 1 MB buffer while it runs, standing in for per-call working state.
 *
 * Where the growth goes: a third process takes a heap snapshot in the middle of the capped
 * turn (10 tools running), which collects garbage first; what is still live then is set
 * against the growth. What the turn allocates and has let go of (the finished tools' buffers)
 * stays in RSS until V8 collects it: V8 collects when its own heap fills, or when memory
 * outside it (a Buffer's bytes) has grown by its external limit (about 64 MB) since the last
 * collection, and 1 MB buffers held by small objects fill the heap slowly.
 *
 * Run: npm run bench:memory
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeHeapSnapshot } from 'node:v8';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';
import { largestKinds } from './memory/snapshot-summary.js';

if (process.env.SLUICE_MEMORY_CHILD) {
  const cap = Number(process.env.SLUICE_MEMORY_CHILD);
  const snapshotFile = process.env.SLUICE_MEMORY_SNAPSHOT;
  let calls = 0;
  let live: NodeJS.MemoryUsage | undefined;
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
          // Half-way, with a full set of tools running: what is live (the snapshot collects first).
          if (snapshotFile && ++calls === 150) {
            writeHeapSnapshot(snapshotFile);
            live = process.memoryUsage();
          }
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
  console.log(JSON.stringify({ before, peakRss, live }));
} else {
  const self = fileURLToPath(import.meta.url);
  const measure = (cap: number, snapshot?: string) => {
    const out = spawnSync(process.execPath, ['--conditions=@sluice/source', '--import', 'tsx', self], {
      env: { ...process.env, SLUICE_MEMORY_CHILD: String(cap), SLUICE_MEMORY_SNAPSHOT: snapshot ?? '' },
      encoding: 'utf8',
    });
    if (out.status !== 0) throw new Error(out.stderr);
    return JSON.parse(out.stdout.trim().split('\n').at(-1)!) as {
      before: number;
      peakRss: number;
      live?: NodeJS.MemoryUsage;
    };
  };
  const mb = (n: number) => `${(n / 1024 / 1024).toFixed(0)} MB`;
  const capped = measure(10);
  const lifted = measure(300);
  console.log('\nOne turn with 300 tool calls, each holding 1 MB while it runs (peak RSS of the process)\n');
  console.log('| tool calls at once | peak RSS | growth during the turn |');
  console.log('|---|---|---|');
  console.log(`| 10 (default cap) | ${mb(capped.peakRss)} | ${mb(capped.peakRss - capped.before)} |`);
  console.log(`| 300 (cap lifted) | ${mb(lifted.peakRss)} | ${mb(lifted.peakRss - lifted.before)} |`);

  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-memory-'));
  const file = join(dir, 'mid-turn.heapsnapshot');
  const snapped = measure(10, file);
  const live = snapped.live!;
  console.log(
    "\nHalf-way through the capped turn, after the heap snapshot's full collection (what is live):",
  );
  console.log(
    `heap used ${mb(live.heapUsed)}, outside the heap ${mb(live.external)} (of it in ArrayBuffers and Buffers ${mb(live.arrayBuffers)}), RSS ${mb(live.rss)}`,
  );
  console.log('Largest kinds of object in the snapshot (self size):');
  for (const k of largestKinds(file)) console.log(`  ${k.kind}: ${mb(k.bytes)} in ${k.count}`);
  rmSync(dir, { recursive: true, force: true });
  const growth = capped.peakRss - capped.before;
  console.log(
    JSON.stringify({
      bench: 'memory',
      capped_growth_mb: Math.round(growth / 2 ** 20),
      lifted_growth_mb: Math.round((lifted.peakRss - lifted.before) / 2 ** 20),
      capped_growth_vs_tool_state: Number((growth / (10 * 2 ** 20)).toFixed(1)),
      live_array_buffers_mid_turn_mb: Math.round(live.arrayBuffers / 2 ** 20),
      live_heap_mid_turn_mb: Math.round(live.heapUsed / 2 ** 20),
    }),
  );
}
