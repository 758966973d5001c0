/**
 * `npm start` / `npm run demo`: writer agents that call researcher agents through a tool, in
 * bursts of interactive users and a steady background load, all sharing one limiter, against
 * the local provider stand-in (no API key, no network). A live view shows the slots and
 * queues per workload and the requests in flight at the provider; the summary gives the
 * provider's peak against the limit and the wait for a slot per workload.
 */
import { pathToFileURL } from 'node:url';
import { createAgent, createConcurrencyLimiter, tool, type ConcurrencyEvent } from 'sluice';
import { startProviderStandIn } from '@sluice/testkit';

export interface DemoOptions {
  /** How long to generate load (ms). */
  durationMs?: number;
  /** Called with each frame of the live view. */
  render?: (frame: string) => void;
  /** Scales every simulated latency and pause (tests use a small value). */
  speed?: number;
}

type Workload = 'interactive' | 'background';

export interface DemoSummary {
  limit: number;
  providerPeakInFlight: number;
  providerRequests: number;
  runs: Record<Workload, number>;
  failed: number;
  waitMs: Record<Workload, { p50: number; p99: number }>;
}

function percentile(values: number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export async function runDemo(options: DemoOptions = {}): Promise<DemoSummary> {
  const durationMs = options.durationMs ?? 8_000;
  const speed = options.speed ?? 1;
  const limit = 6;
  // The stand-in answers as a slow model would: writers ask two researchers, then write.
  const provider = await startProviderStandIn({
    latencyMs: () => (150 + Math.random() * 250) * speed,
    reply: (r) => {
      const system = String(r.messages.find((m) => m.role === 'system')?.content ?? '');
      if (system.includes('researcher')) return { text: 'one relevant fact' };
      const facts = r.messages.filter((m) => m.role === 'tool').length;
      if (facts === 0) {
        return {
          toolCalls: [
            { name: 'research', arguments: { topic: 'history' } },
            { name: 'research', arguments: { topic: 'today' } },
          ],
        };
      }
      return { text: `A short report built on ${facts} facts.` };
    },
  });
  const limiter = createConcurrencyLimiter({
    name: 'provider',
    maxConcurrent: limit,
    maxQueued: 1_000,
    workloads: {
      interactive: { reserved: 2, priority: 10, maxWaitMs: 30_000 },
      background: { maxConcurrent: 4 },
    },
  });
  const model = {
    api: 'openai-completions' as const,
    provider: 'stand-in',
    id: 'demo-model',
    baseUrl: provider.url,
  };
  const credentials = { apiKey: 'demo' };
  const researcher = createAgent({
    model,
    credentials,
    instructions: 'You are a researcher. Find one fact.',
  });
  const waits: Record<Workload, number[]> = { interactive: [], background: [] };
  const writer = createAgent({
    model,
    credentials,
    instructions: 'You are a writer. Ask for research, then write.',
    concurrency: { limiter, workload: 'background' },
    events: {
      onConcurrency: (event: ConcurrencyEvent) => {
        if (event.type === 'acquired') waits[event.workload as Workload].push(event.waitMs);
      },
    },
    tools: [
      tool<{ topic: string }>({
        name: 'research',
        description: 'Ask a researcher agent about a topic',
        parameters: { type: 'object', properties: { topic: { type: 'string' } }, required: ['topic'] },
        execute: async ({ topic }) => (await researcher.run({ prompt: topic })).text,
      }),
    ],
  });

  const runs = { interactive: 0, background: 0 };
  let failed = 0;
  const start = (workload: Workload) =>
    writer.run({ prompt: 'Write about tides', concurrency: { workload }, timeoutMs: 60_000 }).then(
      () => void runs[workload]++,
      () => void failed++,
    );

  const started = Date.now();
  const bar = (n: number, of: number, ch: string) =>
    ch.repeat(Math.min(n, of)) + '.'.repeat(Math.max(0, of - n));
  const frame = () => {
    const s = limiter.stats();
    const elapsed = ((Date.now() - started) / 1000).toFixed(1);
    return [
      `sluice demo: writer agents calling researcher agents, one limiter of ${limit} slots  t=${elapsed}s`,
      `  slots        [${bar(s.active, limit, '#')}] ${s.active}/${limit} taken; at the provider now ${provider.inFlight}, peak ${provider.peakInFlight}`,
      `  interactive  active ${s.workloads.interactive.active} (2 reserved)  queued ${String(s.workloads.interactive.queued).padStart(3)}  runs done ${runs.interactive}`,
      `  background   active ${s.workloads.background.active} (max 4)       queued ${String(s.workloads.background.queued).padStart(3)}  runs done ${runs.background}`,
    ].join('\n');
  };
  const render = options.render ?? (() => undefined);
  const ticker = setInterval(() => render(frame()), 200);

  const work: Promise<void>[] = [];
  let nextBurst = 0;
  while (Date.now() - started < durationMs * speed) {
    work.push(start('background'));
    if (Date.now() - started >= nextBurst) {
      for (let u = 0; u < 6; u++) work.push(start('interactive'));
      nextBurst += 2_000 * speed;
    }
    await sleep(500 * speed);
  }
  await Promise.all(work);
  clearInterval(ticker);
  render(frame());
  const summary: DemoSummary = {
    limit,
    providerPeakInFlight: provider.peakInFlight,
    providerRequests: provider.requests.length,
    runs,
    failed,
    waitMs: {
      interactive: { p50: percentile(waits.interactive, 50), p99: percentile(waits.interactive, 99) },
      background: { p50: percentile(waits.background, 50), p99: percentile(waits.background, 99) },
    },
  };
  await provider.close();
  return summary;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const tty = process.stdout.isTTY;
  let lines = 0;
  const summary = await runDemo({
    render: (frame) => {
      if (tty) {
        if (lines) process.stdout.write(`\x1b[${lines}A\x1b[0J`);
        process.stdout.write(`${frame}\n`);
        lines = frame.split('\n').length;
      } else {
        process.stdout.write(`${frame}\n\n`);
      }
    },
  });
  const w = summary.waitMs;
  console.log(`
Summary
  provider peak in flight  ${summary.providerPeakInFlight} (limit ${summary.limit}), ${summary.providerRequests} requests
  runs finished            interactive ${summary.runs.interactive}, background ${summary.runs.background}, failed ${summary.failed}
  wait for a slot          interactive p50 ${w.interactive.p50} ms, p99 ${w.interactive.p99} ms
                           background  p50 ${w.background.p50} ms, p99 ${w.background.p99} ms`);
}
