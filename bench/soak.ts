/**
 * The soak: three `sluice serve` processes on one PostgreSQL behind PgBouncer (transaction mode,
 * reached through a TCP proxy that can stall or cut), the Redis cache store, and the provider
 * stand-in as an account, loaded by several tenants with every kind of run while a fault
 * injector works through its seeded schedule. Afterwards a checker holds the database's run
 * history and the clients' log against every invariant (bench/soak/checker.ts).
 *
 * Run: npm run soak -- --minutes N --seed S [--clients C]   (defaults: 10 minutes, a random seed,
 * 8 clients). Every service is the soak's own (bench/soak/services.ts), so its PostgreSQL and
 * Redis restarts reach nobody else. The last line is one line of JSON; the exit code is 1 when
 * any violation is not 0.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { toDatabase } from '@sluice/postgres/database';
import { createToken } from '../packages/server/src/store/tokens.js';
import { migrate } from '../packages/server/src/store/store.js';
import { createTcpProxy, type TcpProxy } from '../scripts/tcp-proxy.js';
import {
  check,
  finalStates,
  readChanges,
  readRuns,
  statusHistorySql,
  violationNames,
  type Caps,
} from './soak/checker.js';
import { faultKinds, injectFaults, type FaultKind, type FaultRecord } from './soak/faults.js';
import { runLoad, type Call, type Tenant } from './soak/load.js';
import { startSoakProvider } from './soak/provider.js';
import { seeded } from './soak/random.js';
import { startReceiver } from './soak/receiver.js';
import { countNames, startSampling } from './soak/samples.js';
import { Balancer, soakServer } from './soak/servers.js';
import { freePort, startPgBouncer, startPostgres, startRedis } from './soak/services.js';

const argv = process.argv.slice(2);
const option = (name: string, fallback: number): number => {
  const at = argv.indexOf(`--${name}`);
  if (at < 0) return fallback;
  const value = Number(argv[at + 1]);
  if (!Number.isFinite(value) || value <= 0)
    throw new Error(`Expected --${name} to be a positive number, got ${argv[at + 1]}`);
  return value;
};
const minutes = option('minutes', 10);
const seed = Math.floor(option('seed', 1 + Math.floor(Math.random() * 1_000_000)));
const clients = Math.floor(option('clients', 8));
/** `--faults kill9,db_stall`: only these kinds (to chase one); all of them by default. */
const kinds = ((): FaultKind[] => {
  const at = argv.indexOf('--faults');
  if (at < 0) return [...faultKinds];
  const named = (argv[at + 1] ?? '').split(',');
  const unknown = named.filter((k) => !(faultKinds as readonly string[]).includes(k));
  if (unknown.length > 0 || named.length === 0)
    throw new Error(`Expected --faults to name kinds of ${faultKinds.join(', ')}, got ${argv[at + 1]}`);
  return named as FaultKind[];
})();
/**
 * The settle after the load: the queues drain at the provider's pace, so it goes on while runs
 * keep ending (or callbacks keep coming), and gives up only after this long without progress.
 */
const SETTLE_STALL_MS = 120_000;
/** How often processes and connections are sampled for growth. */
const SAMPLE_EVERY_MS = 5000;
const NODE_STALE_MS = 6000;
const DRAIN_TIMEOUT_MS = 3000;

const caps: Caps = {
  activePerTenant: 8,
  tenantQuota: { t3: 3 },
  activePerProject: 6,
  deferredRunningPerTenant: 2,
  // Low enough to be reached: clients send faster than 4 provider slots drain.
  deferredQueuedPerTenant: 6,
  // Scheduled runs are accepted faster than they run: unbounded, 5,000 were still due when a
  // 30-minute load stopped, and the settle took half an hour.
  scheduledPerTenant: 20,
  // Five users, several clients: some users hold more than three calls at once.
  perUser: 3,
  providerLimit: 4,
};
const who = [
  { tenant: 't1', project: 'p1' },
  { tenant: 't1', project: 'p2' },
  { tenant: 't2', project: 'p1' },
  { tenant: 't3', project: 'p1' },
  { tenant: 't4', project: 'p1' },
];

const log = (line: string) => console.log(`[soak ${new Date().toISOString().slice(11, 19)}] ${line}`);
const random = seeded(seed);
const logDir = mkdtempSync(join(tmpdir(), 'sluice-soak-logs-'));
log(`seed ${seed}, ${minutes} min, ${clients} clients; server logs in ${logDir}`);

/** Stops what the soak started however it ends, an error or Ctrl-C included (each step is synchronous). */
const cleanups: (() => void)[] = [];
const stopAll = () => {
  for (const stop of cleanups.splice(0).reverse()) {
    try {
      stop();
    } catch {
      // the next one still runs
    }
  }
};
process.on('exit', stopAll);
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => process.exit(130));

const postgres = await startPostgres();
cleanups.push(() => postgres.stop());
const database = 'soak';
{
  const admin = new pg.Client({ connectionString: postgres.url });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${database}`);
  await admin.end();
}
const directUrl = postgres.url.replace(/\/postgres$/, `/${database}`);
const migrations = new pg.Pool({ connectionString: directUrl, max: 2 });
await migrate(toDatabase(migrations));
// Every status change of every run, with its microsecond: the checker's timeline (soak-only).
await migrations.query(statusHistorySql);
const secrets = await Promise.all(
  who.map((w, i) => createToken(toDatabase(migrations), { ...w, user: `u${i}`, role: 'member' })),
);
await migrations.end();

const bouncer = await startPgBouncer(postgres, database);
cleanups.push(() => bouncer.stop());
const serverNames = ['s1', 's2', 's3'];
// One proxy per server, so a stall can reach one server and leave the others be.
const proxies = new Map<string, TcpProxy>();
for (const name of serverNames)
  proxies.set(name, await createTcpProxy({ host: '127.0.0.1', port: bouncer.port }));
const redis = await startRedis();
cleanups.push(() => redis.stop());
// Its own generator: the provider's answers do not shift the clients' choices.
const provider = await startSoakProvider(seeded(seed + 2), { maxConcurrent: caps.providerLimit });
const receiver = await startReceiver();

const env: NodeJS.ProcessEnv = { ...process.env };
for (const key of Object.keys(env)) if (key.startsWith('VITEST') || key === 'NODE_OPTIONS') delete env[key];
Object.assign(env, {
  SLUICE_CACHE_STORE: 'redis',
  REDIS_URL: redis.url,
  PROVIDER_URL: provider.standIn.url,
  SOAK_RECEIVER_URL: receiver.url,
  SOAK_LIMIT: String(caps.providerLimit),
  SLUICE_CALLBACK_ALLOW_PRIVATE: '1',
  SLUICE_NODE_STALE_MS: String(NODE_STALE_MS),
  SLUICE_DB_POOL_SIZE: '6',
  SLUICE_LOG_LEVEL: process.env.SLUICE_LOG_LEVEL ?? 'warn',
  MODE: 'production',
  AGENT_SYNC_TIMEOUT_MS: '5000',
  AGENT_RUN_DRAIN_TIMEOUT_MS: String(DRAIN_TIMEOUT_MS),
  AGENT_RUN_CONCURRENCY: '4',
  AGENT_RUN_MAX_ACTIVE_PER_TENANT: String(caps.activePerTenant),
  AGENT_RUN_MAX_ACTIVE_PER_PROJECT: String(caps.activePerProject),
  AGENT_DEFERRED_MAX_RUNNING_PER_TENANT: String(caps.deferredRunningPerTenant),
  // Clients send faster than 4 provider slots drain: a bounded deferred queue refuses the rest
  // (429) instead of leaving an hour of backlog at the end.
  AGENT_DEFERRED_MAX_QUEUED_PER_TENANT: String(caps.deferredQueuedPerTenant),
  SLUICE_MAX_SCHEDULED_PER_TENANT: String(caps.scheduledPerTenant),
  SLUICE_MAX_CONCURRENT_PER_USER: String(caps.perUser),
});
const servers = await Promise.all(
  serverNames.map(async (name) =>
    soakServer(name, await freePort(), {
      env: { ...env, DATABASE_URL: `postgresql://postgres@127.0.0.1:${proxies.get(name)!.port}/${database}` },
      logDir,
      // A drain that has not ended well after its timeout is counted, and the process killed.
      drainBoundMs: DRAIN_TIMEOUT_MS + 30_000,
    }),
  ),
);
cleanups.push(() => servers.forEach((server) => server.kill()));
const started = await Promise.all(servers.map((server) => server.start()));
if (!started.every(Boolean)) throw new Error(`a server did not start; see the logs in ${logDir}`);
// s1 is kept out of kill9 and SIGTERM: one process whose growth is judged over the whole run.
const kept = servers[0]!;
log(`servers ready: ${servers.map((s) => s.url).join(' ')}`);

const tenants: Tenant[] = await Promise.all(
  who.map(async (w, i) => {
    const secret = secrets[i]!.secret;
    const threads = await Promise.all(
      [0, 1].map(async () => {
        const response = await fetch(`${servers[0]!.url}/api/client/v1/threads`, {
          method: 'POST',
          headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
          body: '{}',
        });
        return ((await response.json()) as { id: string }).id;
      }),
    );
    return { name: `${w.tenant}/${w.project}`, secret, threads };
  }),
);

const balancer = new Balancer(servers);
balancer.start();
const sampling = startSampling(
  {
    servers,
    postgresUrl: postgres.url,
    database,
    bouncerAdminUrl: bouncer.url.replace(/\/[^/]*$/, '/pgbouncer'),
    proxySockets: () => [...proxies.values()].reduce((sum, p) => sum + p.openSockets, 0),
    redisPort: redis.port,
  },
  SAMPLE_EVERY_MS,
);
const stopLoad = new AbortController();
const stopFaults = new AbortController();
const loadDone = runLoad({
  random,
  balancer,
  tenants,
  receiverUrl: receiver.url,
  clients,
  signal: stopLoad.signal,
});
const faultsDone = injectFaults(
  { servers, kept, balancer, postgres, proxies, redis, provider, database, nodeStaleMs: NODE_STALE_MS },
  seeded(seed + 1),
  stopFaults.signal,
  kinds,
);
const progress = setInterval(() => log(`${receiver.executions.length} runs executed so far`), 30_000);
await new Promise((resolve) => setTimeout(resolve, minutes * 60_000));
stopFaults.abort();
stopLoad.abort();
const [calls, faults] = await Promise.all([loadDone, faultsDone]);
clearInterval(progress);
await Promise.all(servers.filter((s) => s.pid === undefined).map((s) => s.start()));
log(`load ended: ${calls.length} calls, ${faults.length} faults; settling`);

const settled = await settle(directUrl);
sampling.stop();
await sampling.take();
const runs = await readRuns(directUrl);
const changes = await readChanges(directUrl);
const verdict = check(
  {
    calls,
    executions: receiver.executions,
    deliveries: receiver.deliveries,
    faults,
    changes,
    exits: servers.flatMap((server) => server.exits),
    samples: sampling.samples,
    providerPeak: provider.standIn.peakInFlight,
  },
  runs,
  caps,
);
// A run nobody was told about must end too: the database's own runs not final after the settle.
const stuck = runs.filter((run) => !finalStates.has(run.status));
const acceptedIds = new Set(calls.flatMap((c) => (c.runId ? [c.runId] : [])));
const unseenStuck = stuck.filter((run) => !acceptedIds.has(run.id));
verdict.violations.lost_runs += unseenStuck.length;
if (unseenStuck.length > 0)
  verdict.examples.lost_runs = [
    ...(verdict.examples.lost_runs ?? []),
    ...unseenStuck.slice(0, 5).map((r) => `${r.id} (never answered to a client): ${r.status}`),
  ];

const faultCounts = Object.fromEntries(faultKinds.map((k) => [k, faults.filter((f) => f.kind === k).length]));
report(calls, faults, settled);
await Promise.all(servers.map((server) => server.terminate()));
balancer.stop();
await provider.standIn.close();
await receiver.close();
for (const proxy of proxies.values()) await proxy.close();
stopAll();

const failed = violationNames.some((name) => verdict.violations[name] > 0);
console.log(
  JSON.stringify({
    soak: 'v1',
    seed,
    minutes,
    runs: acceptedIds.size,
    calls: calls.length,
    faults: faultCounts,
    // Refusals by the cap they named: each cap was reached, not only configured.
    refused: Object.fromEntries(
      ['max_active_runs', 'max_queued_runs', 'max_scheduled_runs', 'max_concurrent_per_user'].map((limit) => [
        limit,
        calls.filter((c) => c.limit === limit).length,
      ]),
    ),
    violations: verdict.violations,
  }),
);
process.exitCode = failed ? 1 : 0;

/**
 * Waits until every stored run is final and every final run's callback came; false when nothing
 * moved for SETTLE_STALL_MS.
 */
async function settle(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    let last = '';
    let movedAt = Date.now();
    while (Date.now() - movedAt < SETTLE_STALL_MS) {
      const { rows } = await client.query<{ open: number; uncalled: string[] }>(
        `SELECT count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'canceled'))::int AS open,
                array_agg(id) FILTER (WHERE callback_url IS NOT NULL AND status IN ('succeeded', 'failed', 'canceled')) AS uncalled
           FROM agent_runs`,
      );
      const called = new Set(receiver.deliveries.map((d) => d.runId));
      const waiting = (rows[0]!.uncalled ?? []).filter((id) => !called.has(id)).length;
      if (rows[0]!.open === 0 && waiting === 0) return true;
      const now = `${rows[0]!.open}/${waiting}`;
      if (now !== last) [last, movedAt] = [now, Date.now()];
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    return false;
  } finally {
    await client.end();
  }
}

function report(list: readonly Call[], injected: readonly FaultRecord[], allSettled: boolean): void {
  const byKind = new Map<string, { sent: number; accepted: number }>();
  for (const c of list) {
    const row = byKind.get(c.kind) ?? { sent: 0, accepted: 0 };
    row.sent++;
    if (c.runId) row.accepted++;
    byKind.set(c.kind, row);
  }
  log(`calls by kind: ${[...byKind].map(([k, r]) => `${k} ${r.accepted}/${r.sent}`).join(', ')}`);
  const refusals = new Map<string, number>();
  for (const c of list) if (c.error) refusals.set(c.error, (refusals.get(c.error) ?? 0) + 1);
  log(`refusals and errors: ${[...refusals].map(([e, n]) => `${e} ${n}`).join(', ') || 'none'}`);
  for (const f of injected)
    log(
      `fault ${f.kind} at ${new Date(f.startedAt).toISOString().slice(11, 23)} (${f.detail}): ready again after ${f.readyAt ? `${((f.readyAt - f.startedAt) / 1000).toFixed(1)} s` : 'never'}`,
    );
  const { processes, counts } = sampling.samples;
  log(
    `samples every ${SAMPLE_EVERY_MS / 1000} s: ${processes.length} of processes; ${countNames
      .map((name) => `${name} ${counts[name]?.length ?? 0} (last ${counts[name]?.at(-1)?.count ?? '-'})`)
      .join(', ')}`,
  );
  log(
    `provider: peak ${provider.standIn.peakInFlight} at once (limit ${caps.providerLimit}), ${provider.standIn.requests.length} requests`,
  );
  log(`runs settled: ${allSettled ? 'yes' : `no: nothing moved for ${SETTLE_STALL_MS / 1000} s`}`);
  for (const name of violationNames) {
    const count = verdict.violations[name];
    log(
      `${count === 0 ? 'ok  ' : 'FAIL'} ${name}: ${count}${count ? ` e.g. ${verdict.examples[name]?.join('; ')}` : ''}`,
    );
  }
}
