/**
 * Time the limiter adds to each provider request of an agent, against the same agent with no
 * limiter, on the local provider stand-in (no latency), in one process and one run.
 *
 *   no limiter   createAgent({ model })
 *   limiter      maxConcurrent 64, so a slot is always free: the cost of taking, renewing
 *                and giving back a slot, with its events, and nothing else
 *
 * Run: npm run bench:agent   (-- --quick)
 */
import { performance } from 'node:perf_hooks';
import { createAgent, createConcurrencyLimiter } from 'sluice';
import { startProviderStandIn } from '@sluice/testkit';

const quick = process.argv.includes('--quick');
const runsPerRound = quick ? 200 : 600;
const rounds = quick ? 3 : 7;
const provider = await startProviderStandIn();
const model = {
  api: 'openai-completions' as const,
  provider: 'stand-in',
  id: 'bench',
  baseUrl: provider.url,
};
const credentials = { apiKey: 'bench' };

const variants = {
  'no limiter': createAgent({ model, credentials }),
  'in-memory limiter': createAgent({
    model,
    credentials,
    concurrency: { limiter: createConcurrencyLimiter({ maxConcurrent: 64 }) },
    events: { onConcurrency: () => undefined },
  }),
};

// 16 runs at a time, each one provider request.
async function round(agent: (typeof variants)[keyof typeof variants]): Promise<number> {
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next++ < runsPerRound) await agent.run({ prompt: 'hi' });
    }),
  );
  return (performance.now() - start) / runsPerRound;
}

for (const agent of Object.values(variants)) await round(agent); // warm-up
const samples = new Map<string, number[]>(Object.keys(variants).map((k) => [k, []]));
for (let r = 0; r < rounds; r++) {
  for (const [name, agent] of Object.entries(variants)) samples.get(name)!.push(await round(agent));
}
const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
const base = median(samples.get('no limiter')!);
console.log(
  `\nAgent run with one provider request, 16 at a time, on the stand-in; median of ${rounds} rounds x ${runsPerRound} runs`,
);
console.log(`node ${process.version}, ${new Date().toISOString().slice(0, 10)}\n`);
console.log('| agent | ms per request | added per request | ratio |');
console.log('|---|---|---|---|');
for (const [name, values] of samples) {
  const m = median(values);
  console.log(
    `| ${name} | ${m.toFixed(3)} | ${name === 'no limiter' ? '-' : `${m - base >= 0 ? '+' : ''}${((m - base) * 1000).toFixed(1)} µs`} | ${(m / base).toFixed(2)}x |`,
  );
}
console.log(`\nprovider peak in flight: ${provider.peakInFlight}`);
await provider.close();
