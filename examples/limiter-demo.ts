/**
 * `npm start` / `npm run demo`: one limiter shared by a burst of interactive requests and a
 * steady background load, with a live view of slots and queues per workload and a summary.
 * The "provider" is simulated with timers; no API key, no network.
 */
import { pathToFileURL } from 'node:url';
import { acquireSlot, createConcurrencyLimiter, type ConcurrencyEvent } from 'sluice/concurrency';

export interface DemoOptions {
  /** How long to generate load. */
  durationMs?: number;
  /** Called with each frame of the live view. */
  render?: (frame: string) => void;
  /** Scales every simulated latency (tests use a small value). */
  speed?: number;
}

export interface DemoSummary {
  limit: number;
  peakInFlight: number;
  completed: Record<'interactive' | 'background', number>;
  rejected: number;
  waitMs: Record<'interactive' | 'background', { p50: number; p99: number }>;
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
  const limiter = createConcurrencyLimiter({
    name: 'provider',
    maxConcurrent: 6,
    maxQueued: 500,
    workloads: {
      interactive: { reserved: 2, priority: 10, maxWaitMs: 10_000 },
      background: { maxConcurrent: 4 },
    },
  });
  const waits: Record<'interactive' | 'background', number[]> = { interactive: [], background: [] };
  const completed = { interactive: 0, background: 0 };
  let rejected = 0;
  let inFlight = 0;
  let peakInFlight = 0;
  const onEvent = (event: ConcurrencyEvent) => {
    if (event.type === 'acquired') waits[event.workload as 'interactive' | 'background'].push(event.waitMs);
  };

  // One provider request: take a slot, "stream" for a while, give the slot back.
  const request = async (workload: 'interactive' | 'background', latencyMs: number) => {
    try {
      const slot = await acquireSlot({ limiter, workload, onEvent });
      inFlight++;
      peakInFlight = Math.max(peakInFlight, inFlight);
      await sleep(latencyMs * speed);
      inFlight--;
      await slot.release();
      completed[workload]++;
    } catch {
      rejected++;
    }
  };
  // An agent: a few turns, with "tool" time between them (no slot held while tools run).
  const agent = async (workload: 'interactive' | 'background', turns: number) => {
    for (let t = 0; t < turns; t++) {
      await request(
        workload,
        workload === 'interactive' ? 150 + Math.random() * 250 : 400 + Math.random() * 600,
      );
      await sleep(50 * speed);
    }
  };

  const started = Date.now();
  const work: Promise<void>[] = [];
  const bar = (n: number, of: number, ch: string) => ch.repeat(n) + '.'.repeat(Math.max(0, of - n));
  const frame = () => {
    const s = limiter.stats();
    const elapsed = ((Date.now() - started) / 1000).toFixed(1);
    return [
      `sluice demo: limiter "provider", maxConcurrent 6 (interactive reserves 2, background capped at 4)  t=${elapsed}s`,
      `  slots       [${bar(s.active, 6, '#')}] ${s.active}/6 in flight, peak ${peakInFlight}`,
      `  interactive active ${s.workloads.interactive.active}  queued ${String(s.workloads.interactive.queued).padStart(3)}  done ${completed.interactive}`,
      `  background  active ${s.workloads.background.active}  queued ${String(s.workloads.background.queued).padStart(3)}  done ${completed.background}`,
    ].join('\n');
  };
  const render = options.render ?? (() => undefined);
  const ticker = setInterval(() => render(frame()), 200);

  // Background: a steady trickle of batch agents. Interactive: bursts of users.
  let nextBurst = 0;
  while (Date.now() - started < durationMs * speed) {
    work.push(agent('background', 2));
    if (Date.now() - started >= nextBurst) {
      for (let u = 0; u < 8; u++) work.push(agent('interactive', 2));
      nextBurst += 1500 * speed;
    }
    await sleep(350 * speed);
  }
  await Promise.all(work);
  clearInterval(ticker);
  render(frame());

  return {
    limit: 6,
    peakInFlight,
    completed,
    rejected,
    waitMs: {
      interactive: { p50: percentile(waits.interactive, 50), p99: percentile(waits.interactive, 99) },
      background: { p50: percentile(waits.background, 50), p99: percentile(waits.background, 99) },
    },
  };
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
  peak in flight      ${summary.peakInFlight} (limit ${summary.limit})
  requests completed  interactive ${summary.completed.interactive}, background ${summary.completed.background}, rejected ${summary.rejected}
  wait for a slot     interactive p50 ${w.interactive.p50} ms, p99 ${w.interactive.p99} ms
                      background  p50 ${w.background.p50} ms, p99 ${w.background.p99} ms`);
}
