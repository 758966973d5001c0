/**
 * A streamed run through the run server, against the same provider stream read directly, on
 * this machine, in one run:
 *
 *   - time to the first text delta: from the start of the request to the first `message.delta`
 *     event (server), or to the first chunk with content (direct);
 *   - per-event overhead: a reply of many chunks through the server minus the same reply read
 *     directly, divided by the events the server sent; and the same with the fixed cost of a
 *     run (auth, admission, writing its end) taken out, from a one-chunk reply;
 *   - what storing the events costs (resumable streams, `GET /agents/runs/:id/events`): the
 *     same streams through a second server process that numbers its events but stores none
 *     (`storeRunEvents: false`), side by side in the same run.
 *
 * A third path is the floor under any server between a client and its provider: the same stand-in
 * stream through a bare proxy of a few lines (gateway/bare-proxy.ts: node:http and undici, in a
 * process of its own). What it adds to the first text is what one more process and two more
 * loopback hops cost on this machine, whatever that server does.
 *
 * The peer is the provider stand-in of @sluice/testkit answering an OpenAI-compatible
 * `POST /chat/completions` with `stream: true`, read with fetch: what a client talking to the
 * provider itself would see. The server runs on embedded PGlite and on PostgreSQL (found or
 * started as for the tests; skipped when there is none), a stored and a not-stored process for
 * each; every path uses the same stand-in, whose chunks are 16 characters of text each and are
 * written with no delay between them (so what is measured is the cost of carrying them, not a
 * provider's pace). Besides wall time, each server process reports the CPU time it spent
 * (process.cpuUsage), so what storing costs per event is also had from CPU, which a loaded
 * machine disturbs far less than it does wall time.
 *
 * The server and stand-in processes load the build (dist/), as users run them; the bench
 * builds them first.
 *
 * Run: npm run bench:stream   (-- --quick, -- --smoke: one sample of each, -- --pglite-only). BENCH_CPU_PROF_DIR=dir: the
 * stand-in and each server write a CPU profile there of the time they served (see startProfile).
 */
import { fork, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';
import pg from 'pg';
import { buildEnv, buildPackages } from '../scripts/build-packages.js';
import { serverOf, urlOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from '../scripts/postgres.mjs';

// --smoke: the smallest setting, for the test that the bench ends (its figures mean little).
const smoke = process.argv.includes('--smoke');
const quick = smoke || process.argv.includes('--quick');
const iterations = smoke ? 1 : quick ? 7 : 51;
const warmup = smoke ? 0 : quick ? 2 : 5;
/** The stand-in cuts text into pieces of this many characters (packages/testkit/src/stand-in.ts). */
const CHUNK_CHARS = 16;
const SHORT = 1;
const LONG = 500;

/** A reply of `chunks` stand-in chunks, asked for with the prompt `chunks:N`. */
const textOf = (chunks: number) =>
  Array.from({ length: chunks }, (_, i) => `${String(i).padStart(4, '0')}-abcdefghij `).join('');
if (textOf(1).length !== CHUNK_CHARS) throw new Error('a reply piece must be one stand-in chunk');

/**
 * The client, the run server and the stand-in each get a process of their own: on one event
 * loop the client could not read a delta while the server's embedded database (PGlite runs
 * on the server's thread) writes the run's end, and the stand-in's writing would land on the
 * server's loop, where a real provider's never does.
 */
const role = process.env.SLUICE_STREAM_BENCH_ROLE;

/** Starts this file again as a `role` process; resolves with the JSON line it prints once ready. */
async function start(name: 'provider' | 'server', env: Record<string, string> = {}) {
  const child = spawn(
    process.execPath,
    // The run server and the stand-in run the packages as users get them, built (dist/):
    // without the source condition their imports resolve to the build (scripts/build-packages.ts).
    ['--import', 'tsx', fileURLToPath(import.meta.url)],
    { env: buildEnv({ ...env, SLUICE_STREAM_BENCH_ROLE: name }), stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const lines = createInterface({ input: child.stdout! });
  let ready: (line: string) => void;
  const readyLine = new Promise<string>((resolve) => (ready = resolve));
  // The ready line is the first that names the url; a server may log a warning before it.
  let marked: ((cpuUs: number) => void) | undefined;
  lines.on('line', (l) => {
    if (l.includes('"cpuMark"')) marked?.((JSON.parse(l) as { cpuMark: number }).cpuMark);
    if (l.includes('"url"')) ready(l);
  });
  /** The CPU time the process has spent so far, in µs (it answers SIGUSR2 with it). */
  const cpu = () =>
    new Promise<number>((resolve) => {
      marked = resolve;
      child.kill('SIGUSR2');
    });
  const line = await Promise.race([
    readyLine,
    once(child, 'exit').then(([code]) => {
      throw new Error(`the ${name} process exited with ${String(code)} before it was ready`);
    }),
  ]);
  const stop = async () => {
    child.stdin!.end(); // the child closes what it started when its input ends
    if (child.exitCode === null) await once(child, 'exit');
  };
  return { ready: JSON.parse(line) as Record<string, string>, stop, cpu };
}

/** Serves until the parent closes this process's input. */
async function serveUntilParentLeaves(ready: Record<string, string>, close: () => Promise<unknown>) {
  // The parent gone, this process has no one to tell.
  process.stdout.on('error', () => undefined);
  const profile = await startProfile();
  process.on('SIGUSR2', () => {
    const used = process.cpuUsage();
    console.log(JSON.stringify({ cpuMark: used.user + used.system }));
  });
  console.log(JSON.stringify(ready));
  process.stdin.resume();
  await once(process.stdin, 'end');
  await profile?.();
  await close();
  process.exit(0);
}

/**
 * BENCH_CPU_PROF_DIR=dir: profiles this process from when it is ready until the parent leaves
 * (start-up, migrations and module loading left out) and writes `<role>-<store>-<pid>.cpuprofile`
 * there; the returned function stops and writes it.
 */
async function startProfile(): Promise<(() => Promise<void>) | undefined> {
  const dir = process.env.BENCH_CPU_PROF_DIR;
  if (!dir) return undefined;
  const session = new Session();
  session.connect();
  const post = (method: string) =>
    new Promise<unknown>((resolve, reject) =>
      session.post(method, (error, result) => (error ? reject(error) : resolve(result))),
    );
  await post('Profiler.enable');
  // Every 100 µs (the default is 1 ms): a streamed run's first text comes within a few ms.
  await new Promise((resolve) => session.post('Profiler.setSamplingInterval', { interval: 100 }, resolve));
  await post('Profiler.start');
  return async () => {
    const { profile } = (await post('Profiler.stop')) as { profile: unknown };
    const store = process.env.SLUICE_STREAM_BENCH_DATABASE ? 'postgres' : 'pglite';
    const kind = process.env.SLUICE_STREAM_BENCH_STORE === '0' ? 'unstored' : 'stored';
    const name = role === 'server' ? `server-${store}-${kind}` : String(role);
    writeFileSync(join(dir, `${name}-${process.pid}.cpuprofile`), JSON.stringify(profile));
  };
}

if (role === 'provider') {
  const provider = await startProviderStandIn({
    reply: (r) => {
      const last = [...r.messages].reverse().find((m) => m.role === 'user');
      const asked = /chunks:(\d+)/.exec(
        typeof last?.content === 'string' ? last.content : JSON.stringify(last),
      )?.[1];
      return { text: textOf(Number(asked ?? SHORT)) };
    },
  });
  await serveUntilParentLeaves({ url: provider.url }, () => provider.close());
}
if (role === 'server') {
  const model = {
    api: 'openai-completions' as const,
    provider: 'stand-in',
    id: 'm',
    baseUrl: process.env.SLUICE_STREAM_BENCH_PROVIDER!,
  };
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-stream-'));
  const server = await serve({
    config: defineConfig({ agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) } }),
    port: 0,
    dataDir: dir,
    databaseUrl: process.env.SLUICE_STREAM_BENCH_DATABASE ?? '',
    storeRunEvents: process.env.SLUICE_STREAM_BENCH_STORE !== '0',
    // Warnings only: the info line per request would bury the table.
    logger: { level: 'warn' },
  });
  const token = (
    await createToken(server.store.db, { tenant: 'bench', project: 'p', user: 'u', role: 'member' })
  ).secret;
  await serveUntilParentLeaves({ url: server.url, token }, async () => {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  });
}

buildPackages();
const providerProcess = await start('provider');
const provider = { url: providerProcess.ready.url! };
const bareProxy = fork(fileURLToPath(new URL('./gateway/bare-proxy.ts', import.meta.url)), [], {
  env: { ...process.env, UPSTREAM: provider.url },
  stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
});
const bareUrl = ((await once(bareProxy, 'message')) as [{ url: string }])[0].url;
const stopBareProxy = async () => {
  if (bareProxy.exitCode !== null) return;
  const exited = once(bareProxy, 'exit');
  bareProxy.send({ type: 'stop' });
  await exited;
};

/** The stores measured: embedded PGlite always, PostgreSQL when one is found or can be started. */
const stores: { name: string; databaseUrl: string }[] = [{ name: 'PGlite', databaseUrl: '' }];
const pgUrl = process.argv.includes('--pglite-only')
  ? undefined
  : ((await ensurePostgres()) as string | undefined);
const BENCH_DB = `sluice_bench_stream_${process.pid}`;
const admin = async (sql: string) => {
  const client = new pg.Client({ connectionString: pgUrl });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
};
if (pgUrl) {
  await admin(`CREATE DATABASE ${BENCH_DB}`);
  stores.push({ name: 'PostgreSQL', databaseUrl: urlOf(serverOf(pgUrl).server, BENCH_DB) });
}

interface Target {
  url: string;
  token: string;
  stop: () => Promise<void>;
  cpu: () => Promise<number>;
}
/** A server process on `store`, storing its runs' events or not (the baseline). */
async function target(store: (typeof stores)[number], stored: boolean): Promise<Target> {
  const child = await start('server', {
    SLUICE_STREAM_BENCH_PROVIDER: provider.url,
    SLUICE_STREAM_BENCH_STORE: stored ? '1' : '0',
    SLUICE_STREAM_BENCH_DATABASE: store.databaseUrl,
  });
  return { url: child.ready.url!, token: child.ready.token!, stop: child.stop, cpu: child.cpu };
}
// One after another: two servers migrating one PostgreSQL database at once would wait on each other.
const targets = new Map<string, Target>();
for (const store of stores) {
  targets.set(`${store.name}:stored`, await target(store, true));
  targets.set(`${store.name}:unstored`, await target(store, false));
}

interface Sample {
  /** From the request's start to the first text. */
  firstText: number;
  /** From the request's start to the end of the stream. */
  total: number;
  /** Server only: to the first event of any kind (`run.created`, sent once the run is admitted). */
  firstEvent: number;
  /** Events (server) or data chunks (direct) received. */
  events: number;
  text: string;
}

/** Reads a Server-Sent Events body block by block, calling `onBlock` with each as it is complete. */
async function readBlocks(body: ReadableStream<Uint8Array>, onBlock: (block: string) => void): Promise<void> {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end: number;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      onBlock(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
  }
}

/** The peer: the stand-in's own stream, as a client of the provider reads it (or through `via`). */
async function direct(chunks: number, via = provider.url): Promise<Sample> {
  const start = performance.now();
  const response = await fetch(`${via}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer k' },
    body: JSON.stringify({
      model: 'm',
      stream: true,
      messages: [{ role: 'user', content: `chunks:${chunks}` }],
    }),
  });
  const sample: Sample = { firstText: NaN, total: NaN, firstEvent: NaN, events: 0, text: '' };
  await readBlocks(response.body!, (block) => {
    const data = block.startsWith('data: ') ? block.slice(6) : '';
    if (!data) return;
    sample.events++;
    if (sample.events === 1) sample.firstEvent = performance.now() - start;
    if (data === '[DONE]') return;
    const piece = (JSON.parse(data) as { choices: { delta?: { content?: string } }[] }).choices[0]?.delta
      ?.content;
    if (!piece) return;
    if (sample.text === '') sample.firstText = performance.now() - start;
    sample.text += piece;
  });
  sample.total = performance.now() - start;
  return sample;
}

/** The same reply as a streamed run through `target`. */
async function streamed(chunks: number, to: Target): Promise<Sample> {
  const start = performance.now();
  const response = await fetch(`${to.url}/api/client/v1/agents/echo/runs`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${to.token}` },
    body: JSON.stringify({ input: `chunks:${chunks}`, stream: true }),
  });
  if (response.status !== 200)
    throw new Error(`streamed run answered ${response.status}: ${await response.text()}`);
  const sample: Sample = { firstText: NaN, total: NaN, firstEvent: NaN, events: 0, text: '' };
  let last = '';
  await readBlocks(response.body!, (block) => {
    const event = /^event: (.+)$/m.exec(block)?.[1];
    if (!event) return; // a keep-alive comment
    sample.events++;
    last = event;
    if (sample.events === 1) sample.firstEvent = performance.now() - start;
    if (event !== 'message.delta') return;
    if (sample.text === '') sample.firstText = performance.now() - start;
    sample.text += (JSON.parse(/^data: (.*)$/m.exec(block)![1]!) as { text: string }).text;
  });
  sample.total = performance.now() - start;
  if (last !== 'run.completed') throw new Error(`the streamed run ended with ${last}`);
  return sample;
}

type Path = 'direct' | 'bare' | `${string}:stored` | `${string}:unstored`;
const run = (path: Path, chunks: number) =>
  path === 'direct'
    ? direct(chunks)
    : path === 'bare'
      ? direct(chunks, bareUrl)
      : streamed(chunks, targets.get(path)!);
const cases: [Path, number][] = [
  ['direct', SHORT],
  ['direct', LONG],
  ['bare', SHORT],
  ['bare', LONG],
  ...stores.flatMap((store): [Path, number][] => [
    [`${store.name}:stored`, SHORT],
    [`${store.name}:stored`, LONG],
    [`${store.name}:unstored`, SHORT],
    [`${store.name}:unstored`, LONG],
  ]),
];
const samples = new Map<string, Sample[]>(cases.map(([p, n]) => [`${p}:${n}`, []]));
/** Events each server sent in the measured samples: what its CPU time is divided by. */
const sent = new Map<string, number>();
const loadAtStart = loadavg()[0]!;
/** Each server's CPU time when the measured samples began, in µs. */
const cpuAtStart = new Map<string, number>();
for (let i = 0; i < warmup + iterations; i++) {
  if (i === warmup) {
    sent.clear();
    for (const [path, t] of targets) cpuAtStart.set(path, await t.cpu());
  }
  // Round-robin, so drift on the shared machine falls on every path alike.
  for (const [path, chunks] of cases) {
    // Let the work a streamed run leaves behind once its response has ended (its place, its
    // thread waiters, the garbage of 500 events) finish before the next sample starts.
    await new Promise((resolve) => setTimeout(resolve, 20));
    const sample = await run(path, chunks);
    if (sample.text !== textOf(chunks)) throw new Error(`${path} run of ${chunks} chunks lost text`);
    sent.set(path, (sent.get(path) ?? 0) + sample.events);
    if (i >= warmup) samples.get(`${path}:${chunks}`)!.push(sample);
  }
}
const loadAtEnd = loadavg()[0]!;
// What each server spent over the measured samples (after the warm-up), idle work included:
// the stored and not-stored servers of a store did the same samples over the same span.
const cpuUs = new Map<string, number>();
for (const [path, t] of targets) cpuUs.set(path, (await t.cpu()) - cpuAtStart.get(path)!);
for (const t of targets.values()) await t.stop();
await stopBareProxy();
await providerProcess.stop();
if (pgUrl) await admin(`DROP DATABASE IF EXISTS ${BENCH_DB} WITH (FORCE)`);

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
const m = (key: string, field: keyof Omit<Sample, 'text'>) => median(samples.get(key)!.map((s) => s[field]));
const rowOf = (path: Path, chunks: number) => {
  const key = `${path}:${chunks}`;
  const [store, kind] = path === 'direct' || path === 'bare' ? ['-', path] : path.split(':');
  return {
    path:
      kind === 'direct'
        ? 'stand-in stream read directly'
        : kind === 'bare'
          ? 'stand-in stream, bare proxy'
          : kind === 'stored'
            ? 'streamed run through the server'
            : 'streamed run, events not stored',
    store: store!,
    chunks,
    events: m(key, 'events'),
    firstEvent: m(key, 'firstEvent'),
    firstText: m(key, 'firstText'),
    total: m(key, 'total'),
  };
};
const rows = cases.map(([path, chunks]) => rowOf(path, chunks));
const directShort = rowOf('direct', SHORT);
const directLong = rowOf('direct', LONG);
const directPerChunk =
  ((directLong.total - directShort.total) / (directLong.events - directShort.events)) * 1000;
// The floor: one more process and two more hops, with no work of a server's own.
const bareShort = rowOf('bare', SHORT);
const bareFirstTextVsDirect = bareShort.firstText / directShort.firstText;

const figures = stores.map((store) => {
  const serverShort = rowOf(`${store.name}:stored`, SHORT);
  const serverLong = rowOf(`${store.name}:stored`, LONG);
  const unstoredShort = rowOf(`${store.name}:unstored`, SHORT);
  const unstoredLong = rowOf(`${store.name}:unstored`, LONG);
  const extra = serverLong.events - serverShort.events;
  // CPU: what the storing process spent over the one that stores nothing, per event either sent.
  const stored = `${store.name}:stored`;
  const unstored = `${store.name}:unstored`;
  const cpuPerEvent = cpuUs.get(stored)! / sent.get(stored)! - cpuUs.get(unstored)! / sent.get(unstored)!;
  return {
    store: store.name,
    // The first text through the server against the stand-in's own stream.
    firstTextVsDirect: serverShort.firstText / directShort.firstText,
    firstTextAddedMs: serverShort.firstText - directShort.firstText,
    firstEventMs: serverShort.firstEvent,
    // Everything the server adds to a long stream, spread over its events.
    perEventUs: ((serverLong.total - directLong.total) / serverLong.events) * 1000,
    // The same with the fixed cost of a run (auth, admission, the run's rows) taken out: the
    // added time a long reply costs over a one-chunk reply, per extra event.
    perEventMarginalUs:
      ((serverLong.total - serverShort.total - (directLong.total - directShort.total)) / extra) * 1000,
    // What storing the events adds: the long stream against the same one on a server that
    // stores none, per event; per extra event with the fixed cost of a run taken out on both
    // sides; and in CPU time of the server process.
    storedPerEventUs: ((serverLong.total - unstoredLong.total) / serverLong.events) * 1000,
    storedPerEventMarginalUs:
      ((serverLong.total - serverShort.total - (unstoredLong.total - unstoredShort.total)) / extra) * 1000,
    storedCpuPerEventUs: cpuPerEvent,
    unstoredFirstTextMs: unstoredShort.firstText,
    storedFirstTextMs: serverShort.firstText,
  };
});

console.log(
  `\nStreamed runs through the run server against the stand-in's stream read directly, median of ${iterations}, one run`,
);
console.log(
  `node ${process.version}, ${new Date().toISOString().slice(0, 10)}, chunks of ${CHUNK_CHARS} characters, no delay, load average ${loadAtStart.toFixed(1)} at start, ${loadAtEnd.toFixed(1)} at end\n`,
);
const header = ['path', 'store', 'chunks', 'events', 'first event ms', 'first text ms', 'total ms'];
const table = rows.map((r) => [
  r.path,
  r.store,
  String(r.chunks),
  String(r.events),
  r.path.startsWith('stand-in') ? '-' : r.firstEvent.toFixed(2),
  r.firstText.toFixed(2),
  r.total.toFixed(2),
]);
const widths = header.map((_, i) => Math.max(...[header, ...table].map((r) => r[i]!.length)));
const line = (r: string[]) => `| ${r.map((c, i) => c.padEnd(widths[i]!)).join(' | ')} |`;
console.log(line(header));
console.log(`|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`);
for (const r of table) console.log(line(r));
console.log(`\ndirect: ${directPerChunk.toFixed(1)} µs per extra chunk`);
console.log(
  `bare proxy: first text ${bareShort.firstText.toFixed(2)} ms / direct ${directShort.firstText.toFixed(2)} ms = ${bareFirstTextVsDirect.toFixed(2)}x (the floor of any server in between)`,
);
for (const f of figures) {
  console.log(`\n${f.store}:`);
  console.log(
    `  time to first text delta: ${f.storedFirstTextMs.toFixed(2)} ms / direct ${directShort.firstText.toFixed(2)} ms = ${f.firstTextVsDirect.toFixed(2)}x (+${f.firstTextAddedMs.toFixed(2)} ms; run.created at ${f.firstEventMs.toFixed(2)} ms)`,
  );
  console.log(
    `  per event, ${LONG} chunks: ${f.perEventUs.toFixed(1)} µs over direct; ${f.perEventMarginalUs.toFixed(1)} µs per extra event with the run's fixed cost removed`,
  );
  console.log(
    `  storing the events: ${f.storedPerEventUs.toFixed(1)} µs per event (${LONG} chunks, stored - not stored, wall), ${f.storedPerEventMarginalUs.toFixed(1)} µs per extra event (wall), ${f.storedCpuPerEventUs.toFixed(1)} µs of the server's CPU per event; first text ${f.storedFirstTextMs.toFixed(2)} ms stored / ${f.unstoredFirstTextMs.toFixed(2)} ms not stored`,
  );
}
const round = (n: number, digits = 2) => Number(n.toFixed(digits));
const worst = (pick: (f: (typeof figures)[number]) => number) => round(Math.max(...figures.map(pick)));
console.log(
  JSON.stringify({
    bench: 'stream',
    node: process.version,
    date: new Date().toISOString().slice(0, 10),
    load_average: round(loadAtStart, 1),
    iterations,
    chunkChars: CHUNK_CHARS,
    stores: stores.map((s) => s.name),
    rows: rows.map((r) => ({
      ...r,
      firstEvent: round(r.firstEvent, 3),
      firstText: round(r.firstText, 3),
      total: round(r.total, 3),
    })),
    directPerChunkUs: round(directPerChunk),
    figures: figures.map((f) =>
      Object.fromEntries(Object.entries(f).map(([k, v]) => [k, typeof v === 'number' ? round(v, 3) : v])),
    ),
    // The worse of the stores.
    first_text_vs_direct: worst((f) => f.firstTextVsDirect),
    stored_us_per_event: worst((f) => f.storedPerEventUs),
    stored_us_per_extra_event: worst((f) => f.storedPerEventMarginalUs),
    stored_cpu_us_per_event: worst((f) => f.storedCpuPerEventUs),
    bare_proxy_first_text_vs_direct: round(bareFirstTextVsDirect),
  }),
);
