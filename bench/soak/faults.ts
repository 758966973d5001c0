/**
 * The fault injector: one fault after another on a seeded schedule (each kind once in a shuffled
 * round, then another round), each held for a moment, undone, and followed by a check that every
 * server answers `/readyz` 200 again. Each fault's window, from its start until every server is
 * ready again plus a grace, is when a 503 or a network error is expected.
 */
import pg from 'pg';
import type { TcpProxy } from '../../scripts/tcp-proxy.js';
import type { ProviderFault, SoakProvider } from './provider.js';
import type { Random } from './random.js';
import type { Balancer, SoakServer } from './servers.js';
import type { Postgres, Service } from './services.js';

export const faultKinds = [
  'kill9',
  'sigterm',
  'pg_terminate',
  'pg_restart',
  'redis_restart',
  'db_stall',
  'db_cut',
  'provider_429',
  'provider_500',
  'provider_drop',
] as const;
export type FaultKind = (typeof faultKinds)[number];

export interface FaultRecord {
  kind: FaultKind;
  startedAt: number;
  /** When every server answered `/readyz` 200 again; undefined when that did not happen in time. */
  readyAt?: number;
  endsAt: number;
  detail: string;
}

export interface FaultTargets {
  servers: readonly SoakServer[];
  balancer: Balancer;
  postgres: Postgres;
  /** The TCP proxy between the servers and PgBouncer. */
  proxy: TcpProxy;
  redis: Service;
  provider: SoakProvider;
  database: string;
}

const GRACE_MS = 3000;
// Generous: a server restarted from its sources on a busy 2-core box takes tens of seconds to serve.
const READY_TIMEOUT_MS = 90_000;

/** Injects faults until `signal` aborts (the one in progress is finished and undone). */
export async function injectFaults(
  targets: FaultTargets,
  random: Random,
  signal: AbortSignal,
): Promise<FaultRecord[]> {
  const records: FaultRecord[] = [];
  let round: FaultKind[] = [];
  while (!signal.aborted) {
    await sleep(random.int(1000, 3000));
    if (signal.aborted) break;
    if (round.length === 0) round = random.shuffle(faultKinds);
    const kind = round.shift()!;
    const startedAt = Date.now();
    const detail = await inject(kind, targets, random);
    const readyAt = await everyServerReady(targets.balancer);
    records.push({ kind, startedAt, readyAt, endsAt: (readyAt ?? Date.now()) + GRACE_MS, detail });
  }
  return records;
}

async function inject(kind: FaultKind, t: FaultTargets, random: Random): Promise<string> {
  switch (kind) {
    case 'kill9': {
      const server = random.pick(t.servers);
      t.balancer.remove(server);
      await server.kill9();
      await sleep(random.int(200, 1500));
      await server.start();
      return server.name;
    }
    case 'sigterm': {
      const server = random.pick(t.servers);
      await server.terminate();
      t.balancer.remove(server);
      await server.start();
      return server.name;
    }
    case 'pg_terminate': {
      const count = await terminateBackends(t.postgres.url, t.database, random.int(1, 6));
      return `${count} backends`;
    }
    case 'pg_restart':
      await t.postgres.restart();
      return 'immediate stop, then start';
    case 'redis_restart':
      await t.redis.restart();
      return 'SIGKILL, then start (no persistence)';
    case 'db_stall': {
      const ms = random.int(2000, 6000);
      t.proxy.stall();
      await sleep(ms);
      // What a TCP keepalive would end eventually: the stalled connections are reset.
      t.proxy.cut();
      t.proxy.restore();
      return `${ms} ms`;
    }
    case 'db_cut': {
      const ms = random.int(500, 4000);
      t.proxy.cut();
      await sleep(ms);
      t.proxy.restore();
      return `${ms} ms`;
    }
    default: {
      const ms = random.int(2000, 6000);
      t.provider.fault(kind as ProviderFault);
      await sleep(ms);
      t.provider.fault(undefined);
      return `${ms} ms`;
    }
  }
}

async function terminateBackends(url: string, database: string, count: number): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => undefined);
  try {
    await client.connect();
    const result = await client.query(
      `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE datname = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT $2`,
      [database, count],
    );
    return result.rowCount ?? 0;
  } finally {
    await client.end().catch(() => undefined);
  }
}

async function everyServerReady(balancer: Balancer): Promise<number | undefined> {
  const until = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < until) {
    if (await balancer.allReady()) {
      await balancer.check();
      return Date.now();
    }
    await sleep(200);
  }
  return undefined;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
