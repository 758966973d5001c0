/** The figures of bench/capacity: computed from one configuration's samples, and printed. */
import { account, labels, type Configuration } from './configurations.js';
import type { WorkerResult } from './worker.js';

export interface Figures {
  readonly configuration: Configuration;
  /** Why the configuration could not run (its limiter refused its options); its figures are NaN. */
  readonly notRun?: string;
  /** The provider's 429s per 1,000 requests it received after the warm-up. */
  readonly per1000AfterWarm: number;
  /** The same over the whole window. */
  readonly per1000: number;
  readonly requests: number;
  readonly rateLimited: number;
  /** Tokens served in the window / the most the account could serve in it (full bucket + refill). */
  readonly capacityUsed: number;
  /** Tokens served per minute of the window. */
  readonly tokensPerMinute: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly runs: number;
  readonly failed: number;
  readonly failures: Record<string, number>;
  /** The effective limits the processes' limiters ended at (adaptive only moves it). */
  readonly limits: (number | undefined)[];
  /** What the account saw window by window. */
  readonly windows: readonly Window[];
}

/** One window of a configuration's run, from the account's side. */
export interface Window {
  /** Its start, in ms from the start of the run. */
  readonly fromMs: number;
  readonly requests: number;
  /** 429s by the limit that refused: requests at once, requests a minute, tokens a minute. */
  readonly concurrent: number;
  readonly requestsLimit: number;
  readonly tokensLimit: number;
  /** Tokens served by the requests that ended in it. */
  readonly tokens: number;
}

interface Samples {
  configuration: Configuration;
  atWarm: { requests: number; rateLimited: number };
  atStop: { requests: number; rateLimited: number };
  tokensServed: number;
  windowMs: number;
  runs: WorkerResult[];
  windows: Window[];
}

const per1000 = (limited: number, requests: number) => (requests === 0 ? 0 : (1000 * limited) / requests);

function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

/** A configuration whose limiter could not be built: no figures, and why. */
export function notRun(configuration: Configuration, reason: string): Figures {
  return {
    configuration,
    notRun: reason,
    per1000AfterWarm: NaN,
    per1000: NaN,
    requests: 0,
    rateLimited: 0,
    capacityUsed: NaN,
    tokensPerMinute: NaN,
    p50Ms: NaN,
    p99Ms: NaN,
    runs: 0,
    failed: 0,
    failures: {},
    limits: [],
    windows: [],
  };
}

export function figuresOf(s: Samples): Figures {
  const latencies = s.runs.flatMap((r) => r.latencies);
  const failures: Record<string, number> = {};
  for (const r of s.runs)
    for (const [message, n] of Object.entries(r.failures)) failures[message] = (failures[message] ?? 0) + n;
  return {
    configuration: s.configuration,
    per1000AfterWarm: per1000(
      s.atStop.rateLimited - s.atWarm.rateLimited,
      s.atStop.requests - s.atWarm.requests,
    ),
    per1000: per1000(s.atStop.rateLimited, s.atStop.requests),
    requests: s.atStop.requests,
    rateLimited: s.atStop.rateLimited,
    capacityUsed: s.tokensServed / (account.tokensPerMinute * (1 + s.windowMs / 60_000)),
    tokensPerMinute: s.tokensServed / (s.windowMs / 60_000),
    p50Ms: percentile(latencies, 0.5),
    p99Ms: percentile(latencies, 0.99),
    runs: latencies.length,
    failed: s.runs.reduce((n, r) => n + r.failed, 0),
    failures,
    limits: s.runs.map((r) => r.limit),
    windows: s.windows,
  };
}

const pad = (cells: string[], widths: number[]) =>
  cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');

function print(rows: string[][]): void {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  for (const [i, row] of rows.entries()) {
    console.log(pad(row, widths));
    if (i === 0) console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  }
}

export function printTable(figures: Figures[]): void {
  console.log('');
  print([
    [
      'configuration',
      'requests',
      '429s',
      '429/1000 after warm-up',
      '429/1000 all',
      'tokens/min',
      'capacity used',
      'runs',
      'failed',
      'p50 ms',
      'p99 ms',
      'limit at end',
    ],
    ...figures.map((f) => [
      labels[f.configuration],
      String(f.requests),
      String(f.rateLimited),
      f.per1000AfterWarm.toFixed(1),
      f.per1000.toFixed(1),
      f.tokensPerMinute.toFixed(0),
      f.capacityUsed.toFixed(3),
      String(f.runs),
      String(f.failed),
      f.p50Ms.toFixed(0),
      f.p99Ms.toFixed(0),
      f.limits.every((l) => l === undefined) ? '-' : f.limits.map((l) => l ?? '-').join('/'),
    ]),
  ]);
  for (const f of figures) {
    if (f.notRun) console.log(`  ${f.configuration} not run: ${f.notRun}`);
    const top = Object.entries(f.failures)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 2);
    if (top.length > 0)
      console.log(
        `  ${f.configuration} failures: ${top.map(([m, n]) => `${n}x ${JSON.stringify(m)}`).join('; ')}`,
      );
  }
}

/** Per window: 429s (c: at once, r: requests a minute, t: tokens a minute) and tokens a minute served. */
export function printWindows(figures: Figures[]): void {
  const first = figures.find((f) => f.windows.length > 0);
  if (first === undefined) return;
  const span = first.windows.length > 1 ? first.windows[1]!.fromMs - first.windows[0]!.fromMs : 0;
  console.log(
    `\nper ${span / 1000} s window: 429s as c/r/t (at once / requests / tokens), then tokens a minute`,
  );
  print([
    ['configuration', ...first.windows.map((w) => `${w.fromMs / 1000}s`)],
    ...figures.flatMap((f) => [
      [
        `${f.configuration} 429s`,
        ...f.windows.map((w) => `${w.concurrent}/${w.requestsLimit}/${w.tokensLimit}`),
      ],
      [
        `${f.configuration} tokens/min`,
        ...f.windows.map((w) => String(Math.round((w.tokens * 60_000) / Math.max(1, span)))),
      ],
    ]),
  ]);
}

const ratio = (a: number, b: number) =>
  Number.isNaN(a) || Number.isNaN(b) ? '-' : b === 0 ? (a === 0 ? '1.00x' : 'inf') : `${(a / b).toFixed(2)}x`;

/** Each configuration's capacity used and 429 rate against each other's (row / column). */
export function printRatios(figures: Figures[]): void {
  for (const [title, value] of [
    ['capacity used, row / column', (f: Figures) => f.capacityUsed],
    ['429s per 1,000 after the warm-up, row / column', (f: Figures) => f.per1000AfterWarm],
    ['p99 run latency, row / column', (f: Figures) => f.p99Ms],
  ] as const) {
    console.log(`\n${title}`);
    print([
      ['', ...figures.map((f) => f.configuration)],
      ...figures.map((row) => [row.configuration, ...figures.map((col) => ratio(value(row), value(col)))]),
    ]);
  }
  console.log('');
}

const round = (n: number, digits = 3) => (Number.isFinite(n) ? Number(n.toFixed(digits)) : null);

/** The last line: every configuration's figures under its name. */
export function summaryLine(
  figures: Figures[],
  run: { seconds: number; processes: number; inMemory: boolean; loadStart: number; loadEnd: number },
): string {
  const out: Record<string, unknown> = { bench: 'capacity' };
  for (const f of figures) {
    const k = f.configuration;
    out[`${k}_429_per_1000`] = round(f.per1000AfterWarm, 2);
    out[`${k}_429_per_1000_all`] = round(f.per1000, 2);
    out[`${k}_capacity_used`] = round(f.capacityUsed);
    out[`${k}_p50_ms`] = round(f.p50Ms, 0);
    out[`${k}_p99_ms`] = round(f.p99Ms, 0);
    out[`${k}_requests`] = f.requests;
    out[`${k}_failed_runs`] = f.failed;
  }
  Object.assign(out, {
    seconds_per_configuration: run.seconds,
    processes: run.processes,
    limiters: run.inMemory ? 'memory' : 'postgres',
    load_average_start: round(run.loadStart, 1),
    load_average_end: round(run.loadEnd, 1),
  });
  return JSON.stringify(out);
}
