import pg from 'pg';
import { serverOf } from '../scripts/postgres-config.js';
// @ts-expect-error plain ESM
import { ensurePostgres } from '../scripts/postgres.mjs';
import { startChild } from './queues/child.js';
import { dropDatabase, endToEnd, type Bench } from './queues/phases.js';
import { systems } from './queues/systems.js';

const runs = Number(process.env.RUNS ?? 2000);
const only = (process.env.ONLY ?? 'sluice,graphile').split(',');
const url = (await ensurePostgres()) as string;
const { server, database } = serverOf(url);
const admin = new pg.Client({ ...server, database });
await admin.connect();
const standIn = startChild('./stand-in.ts', {});
const load = startChild('./load.ts', {});
const providerUrl = String((await standIn.ready).url);
await load.ready;
const bench: Bench = { server, admin, standIn, providerUrl, load, prefix: `e2e_tmp_${process.pid}`, workers: 16 };
const tenants = Array.from({ length: 8 }, (_, i) => `tenant-${i}`);
try {
  for (const [i, system] of systems.entries()) {
    if (!only.some((o) => system.name.startsWith(o))) continue;
    const r = await endToEnd(bench, system, i, { tenants, pattern: tenants, tenantCap: 0, runs, delayMs: 0, timeoutMs: 180_000 });
    console.log(system.name, r.rate.toFixed(1), 'runs/s', r.runs, r.seconds.toFixed(1), 's');
  }
} finally {
  for (const i of systems.keys()) await dropDatabase(bench, `${bench.prefix}_${i}`);
  await admin.end();
  await load.stop();
  await standIn.stop();
}
