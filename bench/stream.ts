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
 * The peer is the provider stand-in of @sluice/testkit answering an OpenAI-compatible
 * `POST /chat/completions` with `stream: true`, read with fetch: what a client talking to the
 * provider itself would see. The server runs on embedded PGlite; both paths use the same
 * stand-in, whose chunks are 16 characters of text each and are written with no delay between
 * them (so what is measured is the cost of carrying them, not a provider's pace).
 *
 * Run: npm run bench:stream   (-- --quick)
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';

const quick = process.argv.includes('--quick');
const iterations = quick ? 7 : 51;
const warmup = quick ? 2 : 5;
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
    ['--conditions=@sluice/source', '--import', 'tsx', fileURLToPath(import.meta.url)],
    { env: { ...process.env, ...env, SLUICE_STREAM_BENCH_ROLE: name }, stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const line = await Promise.race([
    once(createInterface({ input: child.stdout! }), 'line').then(([l]) => l as string),
    once(child, 'exit').then(([code]) => {
      throw new Error(`the ${name} process exited with ${String(code)} before it was ready`);
    }),
  ]);
  const stop = async () => {
    child.stdin!.end(); // the child closes what it started when its input ends
    if (child.exitCode === null) await once(child, 'exit');
  };
  return { ready: JSON.parse(line) as Record<string, string>, stop };
}

/** Serves until the parent closes this process's input. */
async function serveUntilParentLeaves(ready: Record<string, string>, close: () => Promise<unknown>) {
  console.log(JSON.stringify(ready));
  process.stdin.resume();
  await once(process.stdin, 'end');
  await close();
  process.exit(0);
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
    databaseUrl: '',
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

const providerProcess = await start('provider');
const provider = { url: providerProcess.ready.url! };
const serverProcess = await start('server', { SLUICE_STREAM_BENCH_PROVIDER: provider.url });
const server = { url: serverProcess.ready.url!, token: serverProcess.ready.token! };
const unstoredProcess = await start('server', {
  SLUICE_STREAM_BENCH_PROVIDER: provider.url,
  SLUICE_STREAM_BENCH_STORE: '0',
});
const unstored = { url: unstoredProcess.ready.url!, token: unstoredProcess.ready.token! };

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

/** The peer: the stand-in's own stream, as a client of the provider reads it. */
async function direct(chunks: number): Promise<Sample> {
  const start = performance.now();
  const response = await fetch(`${provider.url}/chat/completions`, {
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

/** The same reply as a streamed run through `target` (the server that stores its events, by default). */
async function streamed(chunks: number, target = server): Promise<Sample> {
  const start = performance.now();
  const response = await fetch(`${target.url}/api/client/v1/agents/echo/runs`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${target.token}` },
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

const paths = { direct, streamed, unstored: (chunks: number) => streamed(chunks, unstored) } as const;
const cases = [
  ['direct', SHORT],
  ['streamed', SHORT],
  ['direct', LONG],
  ['streamed', LONG],
  ['unstored', SHORT],
  ['unstored', LONG],
] as const;
const samples = new Map<string, Sample[]>(cases.map(([p, n]) => [`${p}:${n}`, []]));
for (let i = 0; i < warmup + iterations; i++) {
  // Round-robin, so drift on the shared machine falls on every path alike.
  for (const [path, chunks] of cases) {
    // Let the work a streamed run leaves behind once its response has ended (its place, its
    // thread waiters, the garbage of 500 events) finish before the next sample starts.
    await new Promise((resolve) => setTimeout(resolve, 20));
    const sample = await paths[path](chunks);
    if (sample.text !== textOf(chunks)) throw new Error(`${path} run of ${chunks} chunks lost text`);
    if (i >= warmup) samples.get(`${path}:${chunks}`)!.push(sample);
  }
}
await serverProcess.stop();
await unstoredProcess.stop();
await providerProcess.stop();

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
const m = (key: string, field: keyof Omit<Sample, 'text'>) => median(samples.get(key)!.map((s) => s[field]));

const rows = cases.map(([path, chunks]) => {
  const key = `${path}:${chunks}`;
  return {
    path: {
      direct: 'stand-in stream read directly',
      streamed: 'streamed run through the server',
      unstored: 'streamed run, events not stored',
    }[path],
    chunks,
    events: m(key, 'events'),
    firstEvent: m(key, 'firstEvent'),
    firstText: m(key, 'firstText'),
    total: m(key, 'total'),
  };
});
const [directShort, serverShort, directLong, serverLong, unstoredShort, unstoredLong] = rows as [
  (typeof rows)[0],
  (typeof rows)[0],
  (typeof rows)[0],
  (typeof rows)[0],
  (typeof rows)[0],
  (typeof rows)[0],
];
const ttfbRatio = serverShort.firstText / directShort.firstText;
const ttfbAdded = serverShort.firstText - directShort.firstText;
// The brief's figure: everything the server adds to a long stream, spread over its events.
const perEventAll = ((serverLong.total - directLong.total) / serverLong.events) * 1000;
// The same with the fixed cost of a run (auth, admission, the run's rows) taken out: the added
// time a long reply costs over a one-chunk reply, per extra event.
const perEventMarginal =
  ((serverLong.total - serverShort.total - (directLong.total - directShort.total)) /
    (serverLong.events - serverShort.events)) *
  1000;
// What storing the events adds: the long stream against the same one on a server that stores
// none, per event; and per extra event, with the fixed cost of a run taken out on both sides.
const storedPerEvent = ((serverLong.total - unstoredLong.total) / serverLong.events) * 1000;
const storedPerEventMarginal =
  ((serverLong.total - serverShort.total - (unstoredLong.total - unstoredShort.total)) /
    (serverLong.events - serverShort.events)) *
  1000;
const directPerChunk =
  ((directLong.total - directShort.total) / (directLong.events - directShort.events)) * 1000;

console.log(
  `\nStreamed run through the run server (PGlite) against the stand-in's stream read directly, median of ${iterations}, one run`,
);
console.log(
  `node ${process.version}, ${new Date().toISOString().slice(0, 10)}, chunks of ${CHUNK_CHARS} characters, no delay\n`,
);
const header = ['path', 'chunks', 'events', 'first event ms', 'first text ms', 'total ms'];
const table = rows.map((r) => [
  r.path,
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
console.log(
  `\ntime to first text delta: server ${serverShort.firstText.toFixed(2)} ms / direct ${directShort.firstText.toFixed(2)} ms = ${ttfbRatio.toFixed(1)}x (+${ttfbAdded.toFixed(2)} ms)`,
);
console.log(
  `per event, ${LONG} chunks: (server total - direct total) / ${serverLong.events} events = ${perEventAll.toFixed(1)} µs`,
);
console.log(
  `per event, fixed cost of a run removed: ${perEventMarginal.toFixed(1)} µs added per extra event (direct: ${directPerChunk.toFixed(1)} µs per chunk)`,
);
console.log(
  `storing the events: ${storedPerEvent.toFixed(1)} µs per event (${LONG} chunks, stored - not stored), ${storedPerEventMarginal.toFixed(1)} µs per extra event; first text ${serverShort.firstText.toFixed(2)} ms stored / ${unstoredShort.firstText.toFixed(2)} ms not stored`,
);
console.log(
  JSON.stringify({
    bench: 'stream',
    node: process.version,
    iterations,
    chunkChars: CHUNK_CHARS,
    rows: rows.map((r) => ({
      ...r,
      firstEvent: Number(r.firstEvent.toFixed(3)),
      firstText: Number(r.firstText.toFixed(3)),
      total: Number(r.total.toFixed(3)),
    })),
    firstTextRatio: Number(ttfbRatio.toFixed(2)),
    firstTextAddedMs: Number(ttfbAdded.toFixed(3)),
    perEventUs: Number(perEventAll.toFixed(2)),
    perEventMarginalUs: Number(perEventMarginal.toFixed(2)),
    directPerChunkUs: Number(directPerChunk.toFixed(2)),
    storedPerEventUs: Number(storedPerEvent.toFixed(2)),
    storedPerEventMarginalUs: Number(storedPerEventMarginal.toFixed(2)),
  }),
);
