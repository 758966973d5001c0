/**
 * The provider gateway's cost: the official `openai` client, 64 calls at once, against the
 * stand-in directly and through the gateway, non-streamed and streamed, in one run. The
 * stand-in and the server each run in a process of their own (as in production, the gateway's
 * work is not on the client's or the provider's event loop). The sides' rounds take turns, so a
 * shared machine's changes in load fall on every side alike.
 *
 * A third side is the floor under any gateway: a bare proxy of a few lines (gateway/bare-proxy.ts,
 * node:http and undici, nothing else) in a process of its own, measured in the same turns. What
 * it adds over direct is what one more process and two more loopback hops cost on this machine;
 * what the gateway adds over it is the gateway's own work.
 *
 * Two phases per kind (non-streamed, streamed):
 * - saturated: 64 calls at once, each starting when the last ended; gives requests per second
 *   through the gateway as a fraction of direct. Its latencies are mostly the wait for a core
 *   (every process of the run shares two), so they are printed but are not the added latency.
 * - paced: calls started on one fixed schedule at half the slower side's saturated rate in all,
 *   the three sides taking the calls in turn, call by call (a third each; at most 64 in flight
 *   per side; a call due while its side is at that cap waits in that side's own line, timed
 *   from its scheduled start, so a slow side can neither hide its delay nor hold back the
 *   others; `paced_held_by_cap` counts them). Gives the added latency, p50 and p99 (gateway
 *   minus direct, ms), and the time added per streamed chunk (the streamed added p50 less the
 *   non-streamed one, over the chunks of a stream, in µs): what a caller of a gateway that is
 *   not overloaded pays. Until 2026-12-04 this phase ran in rounds of one side at a time, each
 *   side at the whole rate; a pause of the shared machine then fell on whichever side's round
 *   was running, and decided every side's p99 (the bare proxy's own added p99 went from -2 to
 *   50 ms between runs). Call by call, a pause falls on all three alike, and what is left of a
 *   side's tail is its own; each process now serves a third of the rate it served then.
 *
 * The children load the build (dist/), as users run it: the bench builds them first.
 *
 * Run: npm run bench:gateway   (-- --quick: the smallest setting; -- --pace F: the paced phase
 * at F times the slower side's saturated rate, in all, instead of 0.5; BENCH_CPU_PROF_DIR=dir: CPU profiles
 * of the server and the stand-in; BENCH_SERVER_NODE_FLAGS="...": node flags for the server and
 * the bare proxy). The last line of output is one line of JSON.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { buildEnv, buildPackages } from '../scripts/build-packages.js';
import type { ChildUse } from './gateway/child.js';
import { interleaved, saturated as load, type Kind, type Sample } from './gateway/load.js';

const quick = process.argv.includes('--quick');
const CONCURRENCY = quick ? 8 : 64;
const ROUNDS = quick ? 2 : 6;
const PER_ROUND = quick ? 8 : 1_280;
const WARMUP = quick ? 4 : 512;
const CHUNKS = 32;
// The paced phase's rate, as a fraction of the slower side's saturated rate. At 0.5 on a
// 2-core machine the load generator (the openai client) is itself busy most of the time, and
// its own pauses are a large part of both sides' p99; a lower pace shows the gateway's cost
// with less of that.
const paceAt = process.argv.indexOf('--pace');
const PACE = paceAt > 0 ? Number(process.argv[paceAt + 1]) : 0.5;
if (!(PACE > 0 && PACE <= 1))
  throw new Error(`--pace takes a fraction in (0, 1], got ${process.argv[paceAt + 1]}`);

type Mode = 'direct' | 'gateway' | 'bare';

function start(
  file: string,
  env: Record<string, string>,
  nodeFlags: string[] = [],
): Promise<{ child: ChildProcess; ready: Record<string, string> }> {
  // BENCH_CPU_PROF_DIR=dir: the server and the stand-in each write a CPU profile there on exit.
  const profile = process.env.BENCH_CPU_PROF_DIR
    ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF_DIR}`]
    : [];
  // The children run the packages as users get them, built (dist/): without the source
  // condition, `sluice` and `@sluice/server` resolve to their build, and tsx only loads the
  // child's own few lines. tsx's transform of the sources wraps every named function as it is
  // created, work that no user's server does.
  const child = fork(fileURLToPath(new URL(file, import.meta.url)), [], {
    execArgv: ['--import', 'tsx', ...profile, ...nodeFlags],
    env: buildEnv(env),
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  return new Promise((resolve, reject) => {
    child.once('message', (ready: Record<string, string>) => resolve({ child, ready }));
    child.once('exit', (code) => reject(new Error(`${file} exited with ${code} before it was ready`)));
  });
}

/** A child's CPU time so far, in µs (user and system), and its GC pauses (gateway/child.ts). */
async function useOf(child: ChildProcess): Promise<ChildUse> {
  const answer = once(child, 'message') as Promise<[ChildUse & { type: string }]>;
  child.send({ type: 'cpu' });
  return (await answer)[0];
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = once(child, 'exit');
  child.send({ type: 'stop' });
  await exited;
}

const quantile = (values: number[], q: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
};
const round = (n: number, digits = 3) => Number(n.toFixed(digits));

async function main(): Promise<void> {
  buildPackages();
  const provider = await start('./gateway/stand-in.ts', { CHUNKS: String(CHUNKS) });
  // BENCH_SERVER_NODE_FLAGS: node flags for the server and the bare proxy, to compare a setting
  // in one run's conditions (e.g. `--allocation-site-pretenuring`, V8's default that
  // `sluice serve` turns off; NODE_OPTIONS cannot carry V8 flags).
  const serverFlags = (process.env.BENCH_SERVER_NODE_FLAGS ?? '').split(/\s+/).filter(Boolean);
  const server = await start('./gateway/server.ts', { UPSTREAM: provider.ready.url! }, serverFlags);
  const bare = await start('./gateway/bare-proxy.ts', { UPSTREAM: provider.ready.url! }, serverFlags);
  try {
    const clients: Record<Mode, OpenAI> = {
      direct: new OpenAI({ apiKey: 'sk-bench-upstream', baseURL: provider.ready.url, maxRetries: 0 }),
      gateway: new OpenAI({
        apiKey: server.ready.token!,
        baseURL: `${server.ready.url}/api/client/v1/gateway/openai`,
        maxRetries: 0,
      }),
      bare: new OpenAI({ apiKey: 'sk-bench-upstream', baseURL: bare.ready.url, maxRetries: 0 }),
    };
    type Key = `${Mode}_${Kind}`;
    const keys: Key[] = [
      'direct_json',
      'gateway_json',
      'bare_json',
      'direct_stream',
      'gateway_stream',
      'bare_stream',
    ];
    const saturated = Object.fromEntries(keys.map((k) => [k, [] as Sample[]])) as Record<Key, Sample[]>;
    const pacedSamples = Object.fromEntries(keys.map((k) => [k, [] as Sample[]])) as Record<Key, Sample[]>;
    // The three sides in a rotating order, so none is always first after the other two.
    const orders = [
      ['direct', 'gateway', 'bare'],
      ['gateway', 'bare', 'direct'],
      ['bare', 'direct', 'gateway'],
    ] as const;
    const turns = (r: number) => orders[r % orders.length]!;
    for (const kind of ['json', 'stream'] as const)
      for (const mode of ['direct', 'gateway', 'bare'] as const)
        await load(clients[mode], kind, WARMUP, CONCURRENCY, CHUNKS);
    // The CPU time the gateway's process (and the bare proxy's) spent on its rounds, per kind:
    // what one request costs it, steadier than a latency on a shared machine.
    const cpuUs = { gateway: { json: 0, stream: 0 }, bare: { json: 0, stream: 0 } };
    // Their GC pauses in the paced phase: each stops every request in flight, so they are a
    // part of the p99 that the process's own CPU time does not show.
    const pacedGc = {
      gateway: { gcs: 0, ms: 0, maxMs: 0 },
      bare: { gcs: 0, ms: 0, maxMs: 0 },
    };
    // What the gateway's process and the bare proxy's used while `run` ran, added to `kind`'s
    // CPU time (and, in the paced phase, to their GC pauses).
    const timed = async <T>(modes: Mode[], kind: Kind, paced: boolean, run: () => Promise<T>): Promise<T> => {
      const children = modes.flatMap((mode) =>
        mode === 'direct' ? [] : [{ mode, child: mode === 'gateway' ? server.child : bare.child }],
      );
      const before = await Promise.all(children.map(({ child }) => useOf(child)));
      const result = await run();
      const after = await Promise.all(children.map(({ child }) => useOf(child)));
      children.forEach(({ mode }, i) => {
        cpuUs[mode][kind] += after[i]!.us - before[i]!.us;
        if (!paced) return;
        const gc = pacedGc[mode];
        gc.gcs += after[i]!.gcs - before[i]!.gcs;
        gc.ms += after[i]!.gcMs - before[i]!.gcMs;
        gc.maxMs = Math.max(gc.maxMs, after[i]!.gcMaxMs);
      });
      return result;
    };
    for (let r = 0; r < ROUNDS; r++)
      for (const kind of ['json', 'stream'] as const)
        for (const mode of turns(r))
          saturated[`${mode}_${kind}`].push(
            await timed([mode], kind, false, () => load(clients[mode], kind, PER_ROUND, CONCURRENCY, CHUNKS)),
          );

    const figures = (all: Sample[]) => {
      const latencies = all.flatMap((s) => s.latencies);
      const requests = all.reduce((n, s) => n + s.requests, 0);
      const ms = all.reduce((n, s) => n + s.ms, 0);
      return { p50: quantile(latencies, 0.5), p99: quantile(latencies, 0.99), rps: (requests * 1000) / ms };
    };
    const sat = Object.fromEntries(keys.map((k) => [k, figures(saturated[k])])) as Record<
      Key,
      ReturnType<typeof figures>
    >;
    // Half the slower side's saturated rate (or --pace), shared by the three sides call by call
    // (a third each): no side is overloaded, so a latency is the work of a call and not the
    // queue for a core, and a pause of the machine falls on every side alike.
    const rates = {
      json: PACE * Math.min(sat.direct_json.rps, sat.gateway_json.rps),
      stream: PACE * Math.min(sat.direct_stream.rps, sat.gateway_stream.rps),
    };
    // Calls that came due while their side had CONCURRENCY in flight (they waited in its line,
    // timed from when they were due): not 0 means some side fell behind the schedule.
    let heldByCap = 0;
    for (let r = 0; r < ROUNDS; r++)
      for (const kind of ['json', 'stream'] as const) {
        const order = turns(r);
        const round = await timed([...order], kind, true, () =>
          interleaved(
            order.map((side) => ({ side, client: clients[side] })),
            kind,
            rates[kind],
            PER_ROUND,
            CONCURRENCY,
            CHUNKS,
          ),
        );
        for (const mode of order) pacedSamples[`${mode}_${kind}`].push(round.samples[mode]);
        heldByCap += round.heldByCap;
      }
    const pace = Object.fromEntries(keys.map((k) => [k, figures(pacedSamples[k])])) as Record<
      Key,
      ReturnType<typeof figures>
    >;

    console.log(
      `openai client, ${ROUNDS} rounds of ${PER_ROUND} calls per side, kind and phase; a stream has ${CHUNKS} chunks`,
    );
    console.log('                         p50 ms   p99 ms   requests/s');
    for (const [phase, table] of [
      [`saturated, ${CONCURRENCY} at once`, sat],
      [
        `paced, the sides call by call (json ${rates.json.toFixed(0)}/s, stream ${rates.stream.toFixed(0)}/s in all, a third each; ${heldByCap} calls waited for their side's cap)`,
        pace,
      ],
    ] as const) {
      console.log(phase);
      for (const [name, v] of Object.entries(table))
        console.log(
          `  ${name.padEnd(22)} ${v.p50.toFixed(2).padStart(7)}  ${v.p99.toFixed(2).padStart(7)}  ${v.rps.toFixed(0).padStart(10)}`,
        );
    }
    // What `side` adds over `base` in the paced phase, per kind and quantile.
    const addedOver = (side: Mode, base: Mode) => ({
      json_p50: pace[`${side}_json`].p50 - pace[`${base}_json`].p50,
      json_p99: pace[`${side}_json`].p99 - pace[`${base}_json`].p99,
      stream_p50: pace[`${side}_stream`].p50 - pace[`${base}_stream`].p50,
      stream_p99: pace[`${side}_stream`].p99 - pace[`${base}_stream`].p99,
    });
    const added = addedOver('gateway', 'direct');
    const throughput = {
      json: sat.gateway_json.rps / sat.direct_json.rps,
      stream: sat.gateway_stream.rps / sat.direct_stream.rps,
    };
    // Each kind went through the gateway and the bare proxy in both phases.
    const perRequest = (us: { json: number; stream: number }) => ({
      json: us.json / (2 * ROUNDS * PER_ROUND),
      stream: us.stream / (2 * ROUNDS * PER_ROUND),
    });
    const cpuPerRequest = perRequest(cpuUs.gateway);
    const bareCpuPerRequest = perRequest(cpuUs.bare);
    const bareAdded = addedOver('bare', 'direct');
    const gatewayOverBare = addedOver('gateway', 'bare');
    const overBare = {
      p50: Math.max(gatewayOverBare.json_p50, gatewayOverBare.stream_p50),
      p99: Math.max(gatewayOverBare.json_p99, gatewayOverBare.stream_p99),
    };
    const perChunkUs = (Math.max(0, added.stream_p50 - added.json_p50) * 1000) / CHUNKS;
    console.log(
      `added p50 ${added.json_p50.toFixed(2)} ms (stream ${added.stream_p50.toFixed(2)}), added p99 ${added.json_p99.toFixed(2)} ms ` +
        `(stream ${added.stream_p99.toFixed(2)}); throughput vs direct ${throughput.json.toFixed(2)} (stream ${throughput.stream.toFixed(2)}); ` +
        `per streamed chunk ${perChunkUs.toFixed(1)} µs added; the server's CPU per request ${cpuPerRequest.json.toFixed(0)} µs ` +
        `(stream ${cpuPerRequest.stream.toFixed(0)}); load average ${loadavg()[0]!.toFixed(1)}`,
    );
    console.log(
      `the bare proxy: added p50 ${bareAdded.json_p50.toFixed(2)} ms (stream ${bareAdded.stream_p50.toFixed(2)}), ` +
        `added p99 ${bareAdded.json_p99.toFixed(2)} ms (stream ${bareAdded.stream_p99.toFixed(2)}); CPU per request ` +
        `${bareCpuPerRequest.json.toFixed(0)} µs (stream ${bareCpuPerRequest.stream.toFixed(0)}); the gateway over it: ` +
        `p50 ${overBare.p50.toFixed(2)} ms, p99 ${overBare.p99.toFixed(2)} ms (the worse kind)`,
    );
    // Over both kinds' paced rounds: 2 * ROUNDS * PER_ROUND requests per side.
    const pacedRequests = 2 * ROUNDS * PER_ROUND;
    const gcLine = (gc: { gcs: number; ms: number; maxMs: number }) =>
      `${gc.gcs} pauses, ${((gc.ms * 1000) / pacedRequests).toFixed(1)} µs a request, the longest ${gc.maxMs.toFixed(1)} ms`;
    console.log(
      `GC in the paced phase: the gateway's process ${gcLine(pacedGc.gateway)}; the bare proxy's ${gcLine(pacedGc.bare)}`,
    );
    console.log(
      JSON.stringify({
        bench: 'gateway',
        added_p50_ms: round(Math.max(added.json_p50, added.stream_p50)),
        added_p99_ms: round(Math.max(added.json_p99, added.stream_p99)),
        throughput_vs_direct: round(Math.min(throughput.json, throughput.stream)),
        per_chunk_added_us: round(perChunkUs, 1),
        json_added_p50_ms: round(added.json_p50),
        json_added_p99_ms: round(added.json_p99),
        stream_added_p50_ms: round(added.stream_p50),
        stream_added_p99_ms: round(added.stream_p99),
        json_throughput_vs_direct: round(throughput.json),
        stream_throughput_vs_direct: round(throughput.stream),
        saturated_added_p50_ms: round(
          Math.max(
            sat.gateway_json.p50 - sat.direct_json.p50,
            sat.gateway_stream.p50 - sat.direct_stream.p50,
          ),
        ),
        saturated_added_p99_ms: round(
          Math.max(
            sat.gateway_json.p99 - sat.direct_json.p99,
            sat.gateway_stream.p99 - sat.direct_stream.p99,
          ),
        ),
        server_cpu_us_per_request_json: round(cpuPerRequest.json, 0),
        server_cpu_us_per_request_stream: round(cpuPerRequest.stream, 0),
        bare_added_p50_ms: round(Math.max(bareAdded.json_p50, bareAdded.stream_p50)),
        bare_added_p99_ms: round(Math.max(bareAdded.json_p99, bareAdded.stream_p99)),
        bare_throughput_vs_direct: round(
          Math.min(sat.bare_json.rps / sat.direct_json.rps, sat.bare_stream.rps / sat.direct_stream.rps),
        ),
        server_gc_us_per_request_paced: round((pacedGc.gateway.ms * 1000) / pacedRequests, 1),
        server_gc_longest_ms_paced: round(pacedGc.gateway.maxMs, 1),
        bare_gc_us_per_request_paced: round((pacedGc.bare.ms * 1000) / pacedRequests, 1),
        bare_cpu_us_per_request_json: round(bareCpuPerRequest.json, 0),
        bare_cpu_us_per_request_stream: round(bareCpuPerRequest.stream, 0),
        gateway_over_bare_p50_ms: round(overBare.p50),
        gateway_over_bare_p99_ms: round(overBare.p99),
        pace: PACE,
        paced_rate_json: round(rates.json, 0),
        paced_rate_stream: round(rates.stream, 0),
        paced_rate_per_side_json: round(rates.json / 3, 0),
        paced_rate_per_side_stream: round(rates.stream / 3, 0),
        paced_held_by_cap: heldByCap,
        concurrency: CONCURRENCY,
        requests_per_side: 2 * ROUNDS * PER_ROUND,
        chunks_per_stream: CHUNKS,
        load_average: round(loadavg()[0]!, 1),
      }),
    );
  } finally {
    await Promise.all([stop(server.child), stop(bare.child), stop(provider.child)]);
  }
}

await main();
