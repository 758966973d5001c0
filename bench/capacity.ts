/**
 * Provider capacity: agents in 4 processes on one PostgreSQL limiter against a provider
 * account whose limits they are not told (the stand-in: 20 requests at once, 60,000 tokens
 * and 600 requests a minute), one configuration after another in the same run:
 *
 *   slots_only   today's Sluice: maxConcurrent 20, no rate
 *   no_limiter   no limiter at all: each run's own retries after a 429
 *   count_after  LiteLLM's way: check the minute's used tokens before, add the usage after
 *   sluice       Sluice adaptive: adaptive, maxConcurrent 64, no rate (learns from 429s and headers)
 *   told         Sluice told the account's limits: rate 600 requests and 60,000 tokens a minute
 *
 * Each configuration gets a fresh account (a new stand-in) and the same prompts, whose sizes
 * vary as an agent's do (most short, some long): tokens a minute bind, not requests. Figures,
 * from the provider's side: its 429s per 1,000 requests after the warm-up (the first 15 s,
 * or a quarter of a shorter window) and in all; the tokens it served in the window as a
 * fraction of the most the account could serve in it (its bucket starts full: 60,000 tokens
 * at the start plus 60,000 a minute after), so 1 is an account kept busy from the first
 * moment to the last; p50 and p99 of the runs' latencies.
 *
 * Run: npm run bench:capacity   (-- --quick: 15 s each; -- --seconds N; -- --only sluice,told). PostgreSQL:
 * DATABASE_URL, else the local server; the bench makes its own database and drops it. The last
 * line of output is one line of JSON (`sluice_*` is the adaptive configuration).
 */
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { startProviderStandIn, type ProviderStandIn, type StandInRequest } from '@sluice/testkit';
import { serverOf, urlOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';
import {
  account,
  agentLoops,
  configurations,
  labels,
  type Configuration,
} from './capacity/configurations.js';
import { answerTokensOf } from './capacity/prompts.js';
import {
  figuresOf,
  notRun,
  printRatios,
  printTable,
  printWindows,
  summaryLine,
  type Figures,
  type Window,
} from './capacity/report.js';
import type { ToWorker, WorkerResult } from './capacity/worker.js';

const argv = process.argv.slice(2);
/** `--in-memory`: one process, Sluice's limiters in memory (what they do without the database's sharing). */
const inMemory = argv.includes('--in-memory');
const PROCESSES = inMemory ? 1 : 4;
const secondsArg = argv.indexOf('--seconds');
const seconds = secondsArg >= 0 ? Number(argv[secondsArg + 1]) : argv.includes('--quick') ? 15 : 120;
if (!Number.isFinite(seconds) || seconds < 1)
  throw new Error(`Expected --seconds to be >= 1, got ${argv[secondsArg + 1]}`);
const onlyArg = argv.indexOf('--only');
const chosen = onlyArg >= 0 ? argv[onlyArg + 1]!.split(',') : [...configurations];
for (const name of chosen)
  if (!(configurations as readonly string[]).includes(name))
    throw new Error(`Expected --only to list some of ${configurations.join(', ')}, got ${name}`);
const durationMs = seconds * 1000;
const warmMs = Math.min(15_000, durationMs / 4);

/** The provider's side of one configuration: what the account saw, sampled at the window's marks. */
interface Account {
  readonly provider: ProviderStandIn;
  /** Tokens of each answered request (prompt and answer, as its usage says), with when. */
  readonly served: { at: number; tokens: number }[];
}

/** The stand-in's figure for a prompt: a quarter of its messages' JSON (as its account counts). */
const promptTokens = (r: StandInRequest) => JSON.stringify(r.messages).length >> 2;
const lastUser = (r: StandInRequest) =>
  String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');

async function startAccount(): Promise<Account> {
  const served: Account['served'] = [];
  const provider = await startProviderStandIn({
    limits: account,
    // A model writes about 330 tokens a second after a first token at 150 ms.
    latencyMs: (r) => 150 + 3 * answerTokensOf(lastUser(r)),
    reply: (r) => {
      const output = answerTokensOf(lastUser(r));
      const input = promptTokens(r);
      served.push({ at: Date.now(), tokens: input + output });
      return { text: 'lorem '.repeat(Math.ceil((output * 4) / 6)), usage: { input, output } };
    },
  });
  return { provider, served };
}

function startWorker(index: number, databaseUrl: string): ChildProcess {
  const child = fork(fileURLToPath(new URL('./capacity/worker.ts', import.meta.url)), [], {
    env: {
      ...process.env,
      PROCESS_INDEX: String(index),
      DATABASE_URL: databaseUrl,
      LOOPS: String(agentLoops / PROCESSES),
      LIMITER: inMemory ? 'memory' : 'postgres',
    },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  return child;
}

/** The next message of a worker of the given type; rejects if the worker exits first. */
function reply<T>(child: ChildProcess, type: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (message: { type: string }) => {
      if (message.type !== type) return;
      child.off('message', onMessage);
      child.off('exit', onExit);
      resolve(message as T);
    };
    const onExit = (code: number | null) =>
      reject(new Error(`a worker exited (${code}) before sending ${type}`));
    child.on('message', onMessage);
    child.once('exit', onExit);
  });
}

async function measure(workers: ChildProcess[], configuration: Configuration): Promise<Figures> {
  const { provider, served } = await startAccount();
  try {
    const send = (message: ToWorker) => workers.forEach((w) => w.send(message));
    const prepared = workers.map((w) => reply<{ error?: string }>(w, 'prepared'));
    send({
      type: 'prepare',
      configuration,
      providerUrl: provider.url,
      limiterName: `bench-${configuration}`,
    });
    const refused = (await Promise.all(prepared)).find((p) => p.error !== undefined);
    if (refused) return notRun(configuration, refused.error!);
    // Every process starts at the same moment; the warm-up and the end are sampled by this one.
    const startAt = Date.now() + 500;
    const warmAt = startAt + warmMs;
    const stopAt = startAt + durationMs;
    const results = workers.map((w) => reply<WorkerResult>(w, 'result'));
    send({ type: 'start', startAt, stopAt });
    const sample = () => ({ requests: provider.requests.length, rateLimited: provider.rateLimited });
    const windows = sampleWindows(provider, served, startAt, stopAt);
    const atWarm = await at(warmAt, sample);
    const atStop = await at(stopAt, sample);
    const runs = await Promise.all(results);
    return figuresOf({
      windows: await windows,
      configuration,
      atWarm,
      atStop,
      tokensServed: served.filter((s) => s.at >= startAt && s.at < stopAt).reduce((n, s) => n + s.tokens, 0),
      windowMs: stopAt - startAt,
      runs,
    });
  } finally {
    await provider.close();
  }
}

/** Each window's length: 8 of them in a 2-minute run. */
const WINDOW_MS = Math.max(1_000, Math.min(15_000, durationMs / 8));

/**
 * What the account saw in each window of the run: requests, 429s by the limit that refused
 * them, tokens served. Read where the goal's figures come from, to tell a start-up burst from
 * a steady leak.
 */
async function sampleWindows(
  provider: ProviderStandIn,
  served: Account['served'],
  startAt: number,
  stopAt: number,
): Promise<Window[]> {
  const out: Window[] = [];
  let seen = provider.requests.length;
  for (let from = startAt; from < stopAt; from += WINDOW_MS) {
    const to = Math.min(stopAt, from + WINDOW_MS);
    await at(to, () => undefined);
    const records = provider.requests.slice(seen);
    seen += records.length;
    const refused = (limit: string) => records.filter((r) => r.rateLimited === limit).length;
    out.push({
      fromMs: from - startAt,
      requests: records.length,
      concurrent: refused('concurrent'),
      requestsLimit: refused('requests'),
      tokensLimit: refused('tokens'),
      tokens: served.filter((t) => t.at >= from && t.at < to).reduce((n, t) => n + t.tokens, 0),
    });
  }
  return out;
}

/** `read()` at the wall-clock time `time`. */
async function at<T>(time: number, read: () => T): Promise<T> {
  await new Promise((r) => setTimeout(r, Math.max(0, time - Date.now())));
  return read();
}

const url = (await ensurePostgres()) as string | undefined;
if (!url) throw new Error('No PostgreSQL server found or startable (set DATABASE_URL)');
const { server, database: adminDatabase } = serverOf(url);
const database = `sluice_bench_capacity_${process.pid}`;
const admin = new pg.Client({ ...server, database: adminDatabase });
admin.on('error', () => undefined);
await admin.connect();
await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
await admin.query(`CREATE DATABASE ${database}`);
const load = { start: loadavg()[0]! };
const workers = Array.from({ length: PROCESSES }, (_, i) => startWorker(i, urlOf(server, database)));
const figures: Figures[] = [];
try {
  await Promise.all(workers.map((w) => reply(w, 'up')));
  console.log(
    `bench:capacity: ${PROCESSES} processes x ${agentLoops / PROCESSES} agent loops${inMemory ? ' (limiters in memory)' : ''}, ${seconds} s per configuration (warm-up ${warmMs / 1000} s), ` +
      `account ${account.maxConcurrent} at once, ${account.tokensPerMinute} tokens and ${account.requestsPerMinute} requests a minute; ` +
      `load average ${load.start.toFixed(1)} at the start`,
  );
  for (const configuration of configurations.filter((c) => chosen.includes(c))) {
    const f = await measure(workers, configuration);
    figures.push(f);
    console.log(`  ${labels[configuration]}: done (load average ${loadavg()[0]!.toFixed(1)})`);
  }
} finally {
  for (const w of workers) if (w.connected) w.send({ type: 'exit' } satisfies ToWorker);
  await Promise.all(
    workers.map((w) => (w.exitCode === null && w.signalCode === null ? once(w, 'exit') : undefined)),
  );
  await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
  await admin.end();
}
printTable(figures);
printWindows(figures);
printRatios(figures);
console.log(
  summaryLine(figures, {
    seconds,
    processes: PROCESSES,
    inMemory,
    loadStart: load.start,
    loadEnd: loadavg()[0]!,
  }),
);
