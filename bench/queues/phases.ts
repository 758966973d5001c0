/**
 * The three measures of bench:queues, each on a fresh database per system, with the system's
 * server, the stand-in and the load generator in processes of their own.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { urlOf, type PostgresServer } from '../../scripts/postgres-config.js';
import { startChild, type Child } from './child.js';
import type { LoadRequest, LoadResult } from './load.js';
import type { SystemOptions, SystemReady } from './options.js';
import { postgresCpuUs } from './postgres-cpu.js';
import type { System } from './systems.js';

export interface Bench {
  server: PostgresServer;
  admin: pg.Client;
  standIn: Child;
  providerUrl: string;
  load: Child;
  /** Database names are this prefix and the system's index, so two runs never share one. */
  prefix: string;
  workers: number;
}

export interface EnqueueFigures {
  rps: number;
  p50: number;
  p99: number;
  wrong: number;
  /** CPU time of the system's server process per request measured (µs). */
  cpuUs: number;
  /** CPU time of the PostgreSQL server per request measured (µs), when it runs on this machine. */
  postgresCpuUs: number | undefined;
}

export interface EndToEndFigures {
  runs: number;
  /** Runs finished per second, from the first POST to the last run's end. */
  rate: number;
  seconds: number;
  finished: boolean;
  failed: number;
  /** The highest number of model calls in flight for one tenant, per tenant. */
  peaks: Record<string, number>;
  /** The watched tenant (the first of the measure's) and the most of its runs open at once. */
  watched: string;
  demand: number;
  /** CPU time of the system's server process per run done, from the first POST to the last end (µs). */
  cpuUs: number;
  /** The same for the PostgreSQL server (µs), when it runs on this machine. */
  postgresCpuUs: number | undefined;
}

/** CPU time the child has used so far (µs). */
const cpuOf = async (child: Child) => (await child.request<{ us: number }>('cpu')).us;

/**
 * Starts counting the CPU of the server process and of PostgreSQL; the function returned stops
 * the count and gives a function that spreads it over a number of requests or runs (µs each).
 */
async function cpuSpan(server: Child) {
  const serverBefore = await cpuOf(server);
  const postgres = postgresCpuUs();
  return async () => {
    const serverUs = (await cpuOf(server)) - serverBefore;
    const postgresNow = postgresCpuUs();
    const postgresUs =
      postgres === undefined || postgresNow === undefined ? undefined : postgresNow - postgres;
    return (count: number) => ({
      cpuUs: serverUs / Math.max(1, count),
      postgresCpuUs: postgresUs === undefined ? undefined : postgresUs / Math.max(1, count),
    });
  };
}

async function freshDatabase(bench: Bench, name: string): Promise<string> {
  await bench.admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await bench.admin.query(`CREATE DATABASE ${name}`);
  return urlOf(bench.server, name);
}

export async function dropDatabase(bench: Bench, name: string): Promise<void> {
  await bench.admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
}

async function withServer<T>(
  bench: Bench,
  system: System,
  index: number,
  options: Omit<SystemOptions, 'databaseUrl' | 'providerUrl' | 'workers'>,
  body: (ready: SystemReady, databaseUrl: string, server: Child) => Promise<T>,
  end: 'stop' | 'kill',
): Promise<T> {
  const name = `${bench.prefix}_${index}`;
  const databaseUrl = await freshDatabase(bench, name);
  const server = startChild(system.script, {
    ...options,
    databaseUrl,
    providerUrl: bench.providerUrl,
    workers: bench.workers,
  } satisfies SystemOptions);
  try {
    const ready = (await server.ready) as unknown as SystemReady;
    const result = await body(ready, databaseUrl, server);
    await (end === 'stop' ? server.stop() : server.kill());
    return result;
  } catch (error) {
    await server.kill();
    throw error;
  } finally {
    await dropDatabase(bench, name);
  }
}

const runLoad = (bench: Bench, request: LoadRequest) =>
  bench.load.request<LoadResult>('run', request as unknown as Record<string, unknown>);

/**
 * Requests/s of POSTs that enqueue a run, `clients` at once, after a warm-up.
 * The stand-in stalls, so the workers hold the first runs and take no more: what is measured is
 * the enqueue path alone. The server is ended at once after (its workers would wait forever).
 */
export async function enqueue(
  bench: Bench,
  system: System,
  index: number,
  tenants: string[],
  clients: number,
  length: {
    warmUp: Pick<LoadRequest, 'seconds' | 'amount'>;
    measured: Pick<LoadRequest, 'seconds' | 'amount'>;
  },
): Promise<EnqueueFigures> {
  await bench.standIn.request('mode', { stall: true });
  return withServer(
    bench,
    system,
    index,
    { tenants, tenantCap: 10 },
    async (ready, _url, server) => {
      await runLoad(bench, { system: ready, pattern: tenants, connections: clients, ...length.warmUp });
      const counting = await cpuSpan(server);
      const r = await runLoad(bench, {
        system: ready,
        pattern: tenants,
        connections: clients,
        ...length.measured,
      });
      const spent = await counting();
      return { rps: r.rps, p50: r.p50, p99: r.p99, wrong: r.wrong, ...spent(r.accepted) };
    },
    'kill',
  );
}

/**
 * `runs` runs POSTed by 32 clients, the model answering after `delayMs`: runs/s from the first
 * POST to the moment the database shows none left open (polled every 10 ms), or what was done
 * by `timeoutMs`.
 */
export async function endToEnd(
  bench: Bench,
  system: System,
  index: number,
  options: {
    tenants: string[];
    pattern: string[];
    tenantCap: number;
    runs: number;
    delayMs: number;
    timeoutMs: number;
  },
): Promise<EndToEndFigures> {
  await bench.standIn.request('mode', { delayMs: options.delayMs });
  return withServer(
    bench,
    system,
    index,
    { tenants: options.tenants, tenantCap: options.tenantCap },
    async (ready, databaseUrl, server) => {
      const db = new pg.Client({ connectionString: databaseUrl });
      await db.connect();
      try {
        const counting = await cpuSpan(server);
        const loaded = runLoad(bench, {
          system: ready,
          pattern: options.pattern,
          connections: 32,
          amount: options.runs,
        });
        let load: LoadResult | undefined;
        void loaded.then((r) => (load = r)).catch(() => undefined);
        const deadline = Date.now() + options.timeoutMs;
        // The first tenant's runs open at once (queued or running), the most seen: past the
        // cap, the cap decided something in this measure.
        const watched = options.tenants[0]!;
        let seen = await system.open(db, watched);
        let demand = seen.openOfTenant;
        while ((load === undefined || seen.open > 0) && Date.now() < deadline) {
          await sleep(10);
          seen = await system.open(db, watched);
          demand = Math.max(demand, seen.openOfTenant);
        }
        const end = Date.now();
        const spent = await counting();
        const result = await loaded;
        const state = await system.pending(db, watched);
        const done = result.accepted - state.open - state.failed;
        const { peaks } = await bench.standIn.request<{ peaks: Record<string, number> }>('peaks');
        const seconds = (end - result.startMs) / 1000;
        if (result.wrong > 0) console.warn(`${system.name}: ${result.wrong} POSTs not accepted`);
        return {
          runs: done,
          rate: done / seconds,
          seconds,
          finished: state.open === 0,
          failed: state.failed,
          peaks,
          watched,
          demand,
          ...spent(done),
        };
      } finally {
        await db.end();
      }
    },
    'stop',
  );
}
