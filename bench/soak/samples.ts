/**
 * Resource samples taken on an interval: every server process (resident memory, open file
 * descriptors), and the connections of everything between them (the database's sessions,
 * PgBouncer's clients, the proxies' sockets, Redis's clients); and the growth rule the checker
 * applies to them.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import pg from 'pg';
import type { SoakServer } from './servers.js';

export interface ProcessSample {
  pid: number;
  server: string;
  at: number;
  rssMb: number;
  fds: number;
}

export interface CountSample {
  at: number;
  count: number;
}

/** The connection counts sampled, by name. */
export const countNames = [
  'database sessions',
  'pgbouncer clients',
  'proxy sockets',
  'redis clients',
] as const;
export type CountName = (typeof countNames)[number];

export interface Samples {
  processes: ProcessSample[];
  counts: Partial<Record<CountName, CountSample[]>>;
}

export interface SampledServices {
  servers: readonly SoakServer[];
  /** A superuser's URL straight to PostgreSQL, and the soak's database there. */
  postgresUrl: string;
  database: string;
  /** PgBouncer's admin console (`…/pgbouncer`). */
  bouncerAdminUrl: string;
  /** Sockets open in the proxies now. */
  proxySockets: () => number;
  redisPort: number;
}

function sampleOf(server: SoakServer, pid: number): ProcessSample | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const rssKb = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? 0);
    return {
      pid,
      server: server.name,
      at: Date.now(),
      rssMb: rssKb / 1024,
      fds: readdirSync(`/proc/${pid}/fd`).length,
    };
  } catch {
    return undefined; // it ended between the look and the read
  }
}

/** One number from a SQL query; undefined while the service is away for a fault. */
async function sqlCount(url: string, text: string, values?: unknown[]): Promise<number | undefined> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    const { rows } = await client.query<Record<string, unknown>>(text, values);
    return rows.reduce((sum, row) => sum + Number(Object.values(row)[0] ?? 0), 0);
  } catch {
    return undefined;
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Redis's `connected_clients`; undefined while it is away. */
function redisClients(port: number): Promise<number | undefined> {
  return new Promise((done) => {
    const socket = connect({ host: '127.0.0.1', port });
    let text = '';
    const finish = (n: number | undefined) => (socket.destroy(), done(n));
    socket.setTimeout(2000, () => finish(undefined));
    socket.once('error', () => finish(undefined));
    socket.once('connect', () => socket.write('INFO clients\r\n'));
    socket.on('data', (chunk) => {
      text += chunk.toString();
      const found = /connected_clients:(\d+)/.exec(text);
      // The soak's own connection is one of them.
      if (found) finish(Number(found[1]) - 1);
    });
  });
}

/** Samples every `everyMs` until `stop()`; the first sample is taken at once. */
export function startSampling(services: SampledServices, everyMs: number) {
  const samples: Samples = { processes: [], counts: {} };
  const add = (name: CountName, count: number | undefined) => {
    if (count !== undefined) (samples.counts[name] ??= []).push({ at: Date.now(), count });
  };
  const take = async () => {
    for (const server of services.servers) {
      const sample = server.pid === undefined ? undefined : sampleOf(server, server.pid);
      if (sample) samples.processes.push(sample);
    }
    add('proxy sockets', services.proxySockets());
    const [sessions, bouncer, redis] = await Promise.all([
      sqlCount(
        services.postgresUrl,
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [services.database],
      ),
      bouncerClients(services.bouncerAdminUrl, services.database),
      redisClients(services.redisPort),
    ]);
    add('database sessions', sessions);
    add('pgbouncer clients', bouncer);
    add('redis clients', redis);
  };
  void take();
  const timer = setInterval(() => void take(), everyMs);
  return { samples, take, stop: () => clearInterval(timer) };
}

/**
 * PgBouncer's client connections to `database` (active and waiting). Its admin console speaks
 * the simple protocol only: a query with no parameters. One row per pool.
 */
async function bouncerClients(url: string, database: string): Promise<number | undefined> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    const { rows } = await client.query<{ database: string; cl_active: string; cl_waiting: string }>(
      'SHOW POOLS',
    );
    return rows
      .filter((row) => row.database === database)
      .reduce((sum, row) => sum + Number(row.cl_active) + Number(row.cl_waiting), 0);
  } catch {
    return undefined;
  } finally {
    await client.end().catch(() => undefined);
  }
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? 0;
};

/**
 * Whether a series kept growing: the median of its last quarter against the median of its
 * second quarter (the start, when pools and caches fill, is left out; a median, so one sample
 * taken in a fault's spike does not decide). Needs eight samples.
 */
function grew(values: number[], factor: number, floor: number): { early: number; late: number } | undefined {
  if (values.length < 8) return undefined;
  const quarter = Math.floor(values.length / 4);
  const early = median(values.slice(quarter, 2 * quarter));
  const late = median(values.slice(values.length - quarter));
  return late > early * factor && late - early > floor ? { early, late } : undefined;
}

/** How much a count may grow between the second and the last quarter before it counts. */
const countGrowth: Record<CountName, { factor: number; floor: number }> = {
  'database sessions': { factor: 2, floor: 40 },
  'pgbouncer clients': { factor: 2, floor: 40 },
  'proxy sockets': { factor: 2, floor: 60 },
  'redis clients': { factor: 2, floor: 20 },
};

/**
 * Growth without bound, judged per process (each incarnation of a server on its own; the one
 * server no fault stops is judged over the whole run) and per connection count. Memory counts
 * only when its late median is both over 1.5x and over 150 MB above its early one (JIT, pools
 * and caches settle after start); file descriptors over 2x and over 200 more; each connection
 * count as `countGrowth` says.
 */
export function unboundedGrowth(samples: Samples): string[] {
  const found: string[] = [];
  const byPid = new Map<number, ProcessSample[]>();
  for (const s of samples.processes) byPid.set(s.pid, [...(byPid.get(s.pid) ?? []), s]);
  for (const [pid, list] of byPid) {
    const server = list[0]!.server;
    const memory = grew(
      list.map((s) => s.rssMb),
      1.5,
      150,
    );
    if (memory)
      found.push(`${server} (pid ${pid}): memory ${memory.early.toFixed(0)} -> ${memory.late.toFixed(0)} MB`);
    const fds = grew(
      list.map((s) => s.fds),
      2,
      200,
    );
    if (fds) found.push(`${server} (pid ${pid}): file descriptors ${fds.early} -> ${fds.late}`);
  }
  for (const name of countNames) {
    const rule = countGrowth[name];
    const growth = grew(
      (samples.counts[name] ?? []).map((s) => s.count),
      rule.factor,
      rule.floor,
    );
    if (growth) found.push(`${name} ${growth.early} -> ${growth.late}`);
  }
  return found;
}
