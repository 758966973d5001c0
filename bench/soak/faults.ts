/**
 * The fault injector: one fault after another on a seeded schedule (each kind once in a shuffled
 * round, then another round), each held for a moment, undone, and followed by a check that every
 * server answers `/readyz` 200 again. A fault's window runs from its start until every server is
 * ready again plus a grace; between two windows there is a quiet gap of several seconds, so the
 * checker sees the system with no fault on, and can tell an error of a fault from one without.
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

/**
 * What each fault may cause a client to see: a 503 (a draining server, a database or cache
 * away), and network errors (a connection reset by a killed or stopping process; only on the
 * fault's own server when it has one). Anything else, during a fault or not, is a violation.
 */
export const faultEffects: Record<FaultKind, { status503: boolean; networkErrors: boolean }> = {
  kill9: { status503: false, networkErrors: true },
  sigterm: { status503: true, networkErrors: true },
  pg_terminate: { status503: true, networkErrors: false },
  pg_restart: { status503: true, networkErrors: false },
  redis_restart: { status503: true, networkErrors: false },
  db_stall: { status503: true, networkErrors: false },
  db_cut: { status503: true, networkErrors: false },
  provider_429: { status503: false, networkErrors: false },
  provider_500: { status503: false, networkErrors: false },
  provider_drop: { status503: false, networkErrors: false },
};

export interface FaultRecord {
  kind: FaultKind;
  startedAt: number;
  /** When every server answered `/readyz` 200 again; undefined when that did not happen in time. */
  readyAt?: number;
  /** The end of the fault's window: ready again plus a grace. */
  endsAt: number;
  /** The server the fault was aimed at, when it was aimed at one. */
  target?: string;
  detail: string;
}

export interface FaultTargets {
  servers: readonly SoakServer[];
  /** The server kept out of kill9 and SIGTERM, so its growth is judged over the whole run. */
  kept: SoakServer;
  balancer: Balancer;
  postgres: Postgres;
  /** Each server's TCP proxy to PgBouncer, by server name. */
  proxies: ReadonlyMap<string, TcpProxy>;
  redis: Service;
  provider: SoakProvider;
  database: string;
  /** The servers' SLUICE_NODE_STALE_MS: a stall lasts longer than it. */
  nodeStaleMs: number;
}

export const GRACE_MS = 3000;
/** The quiet gap between the end of one fault's window and the next fault. */
export const QUIET_MS = { min: 4000, max: 9000 };
// Generous: a server restarted from its sources on a busy 2-core box takes tens of seconds to
// serve. Counted from the fault's start, so a restart that was slow counts too.
const READY_TIMEOUT_MS = 120_000;

/** Injects faults of `kinds` until `signal` aborts (the one in progress is finished and undone). */
export async function injectFaults(
  targets: FaultTargets,
  random: Random,
  signal: AbortSignal,
  kinds: readonly FaultKind[] = faultKinds,
): Promise<FaultRecord[]> {
  const records: FaultRecord[] = [];
  let round: FaultKind[] = [];
  await sleep(random.int(QUIET_MS.min, QUIET_MS.max), signal);
  while (!signal.aborted) {
    // A server that ended by itself (counted by servers.ts) comes back before the next fault.
    for (const server of targets.servers) if (server.pid === undefined) await server.start();
    if (round.length === 0) round = random.shuffle(kinds);
    const kind = round.shift()!;
    const startedAt = Date.now();
    const { target, detail } = await inject(kind, targets, random);
    const readyAt = await everyServerReady(targets.balancer, startedAt + READY_TIMEOUT_MS);
    records.push({ kind, startedAt, readyAt, endsAt: (readyAt ?? Date.now()) + GRACE_MS, target, detail });
    await sleep(GRACE_MS + random.int(QUIET_MS.min, QUIET_MS.max), signal);
  }
  return records;
}

async function inject(
  kind: FaultKind,
  t: FaultTargets,
  random: Random,
): Promise<{ target?: string; detail: string }> {
  const stoppable = t.servers.filter((s) => s !== t.kept);
  switch (kind) {
    case 'kill9': {
      const server = random.pick(stoppable);
      t.balancer.remove(server);
      await server.kill9();
      await sleep(random.int(200, 1500));
      await server.start();
      return { target: server.name, detail: server.name };
    }
    case 'sigterm': {
      const server = random.pick(stoppable);
      await server.terminate();
      t.balancer.remove(server);
      await server.start();
      return { target: server.name, detail: server.name };
    }
    case 'pg_terminate': {
      const count = await terminateBackends(t.postgres.url, t.database, random.int(1, 6));
      return { detail: `${count} busy backends` };
    }
    case 'pg_restart':
      await t.postgres.restart();
      return { detail: 'immediate stop, then start' };
    case 'redis_restart':
      await t.redis.restart();
      return { detail: 'SIGKILL, then start (no persistence)' };
    case 'db_stall': {
      // One server's connections go silent for longer than a peer takes to declare it gone,
      // and stay silent: nothing resets them, as after a partition with no RST.
      const server = random.pick(t.servers);
      const ms = t.nodeStaleMs + random.int(1000, 4000);
      const proxy = t.proxies.get(server.name)!;
      proxy.stall();
      await sleep(ms);
      return { target: server.name, detail: `${server.name} ${ms} ms, never reset` };
    }
    case 'db_cut': {
      const ms = random.int(500, 4000);
      for (const proxy of t.proxies.values()) proxy.cut();
      await sleep(ms);
      for (const proxy of t.proxies.values()) proxy.restore();
      return { detail: `${ms} ms` };
    }
    default: {
      const ms = random.int(2000, 6000);
      t.provider.fault(kind as ProviderFault);
      await sleep(ms);
      t.provider.fault(undefined);
      return { detail: `${ms} ms` };
    }
  }
}

/**
 * Ends up to `count` backends of the soak's database that are in a statement or a transaction
 * (behind PgBouncer most are idle between transactions: ending those tests little). Looks
 * again for up to two seconds until `count` were ended.
 */
async function terminateBackends(url: string, database: string, count: number): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => undefined);
  let ended = 0;
  try {
    await client.connect();
    const until = Date.now() + 2000;
    while (ended < count && Date.now() < until) {
      const result = await client.query<{ ended: boolean }>(
        `SELECT pg_terminate_backend(pid) AS ended FROM pg_stat_activity
          WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
            AND state IS NOT NULL AND state <> 'idle'
          ORDER BY random() LIMIT $2`,
        [database, count - ended],
      );
      ended += result.rows.filter((row) => row.ended).length;
      await sleep(20);
    }
    return ended;
  } finally {
    await client.end().catch(() => undefined);
  }
}

async function everyServerReady(balancer: Balancer, until: number): Promise<number | undefined> {
  while (Date.now() < until) {
    if (await balancer.allReady()) {
      await balancer.check();
      return Date.now();
    }
    await sleep(200);
  }
  return undefined;
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done);
  });
}
