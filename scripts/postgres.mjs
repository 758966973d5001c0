// Finds a PostgreSQL server for the test suite, or starts one, and prints nothing on success.
// Order: $DATABASE_URL; a server already listening on the default socket; the machine's
// cluster (pg_ctlcluster, when running as root, as CI does); a private cluster made with
// initdb under .sluice/ (when not root). Under CI=true, failing to find one is an error.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { userInfo } from 'node:os';
import { join, resolve } from 'node:path';
import { postgresAnswers } from './probes.mjs';

// The suite runs three files at once, several of which start `sluice serve` processes with
// pools of their own; PostgreSQL's default of 100 sessions ran out ("sorry, too many clients
// already") on a CI run. Only a cluster started here gets this; one already running is the
// user's to configure.
const MAX_CONNECTIONS = 400;

const reachable = (connectionString) => postgresAnswers(connectionString);

function binDir() {
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root).sort((a, b) => Number(b) - Number(a));
  for (const v of versions) if (existsSync(join(root, v, 'bin', 'pg_ctl'))) return join(root, v, 'bin');
  return undefined;
}

function run(cmd, args) {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  return { ok: r.status === 0, out: `${r.stdout ?? ''}${r.stderr ?? ''}`.trim() };
}

async function startSystemCluster(user) {
  const list = run('pg_lsclusters', ['--no-header']);
  if (!list.ok) return undefined;
  const line = list.out.split('\n').find((l) => l.trim());
  if (!line) return undefined;
  const [version, name, port] = line.trim().split(/\s+/);
  const started = run('pg_ctlcluster', [
    '--skip-systemctl-redirect',
    '-o',
    `-c max_connections=${MAX_CONNECTIONS}`,
    version,
    name,
    'start',
  ]);
  if (!started.ok && !/already running/.test(started.out))
    throw new Error(`pg_ctlcluster failed: ${started.out}`);
  run('su', ['postgres', '-c', `createuser -s ${user}`]);
  const url = `postgresql://${user}@/postgres?host=/var/run/postgresql&port=${port}`;
  for (let i = 0; i < 50; i++) {
    if (await reachable(url)) return url;
    await new Promise((r) => setTimeout(r, 200));
  }
  return undefined;
}

async function startPrivateCluster(user) {
  const bin = binDir();
  if (!bin) return undefined;
  const dir = resolve('.sluice/test-postgres');
  const port = 55432;
  if (!existsSync(join(dir, 'PG_VERSION'))) {
    mkdirSync(dir, { recursive: true });
    execFileSync(join(bin, 'initdb'), ['-D', dir, '-U', user, '--auth=trust'], { stdio: 'ignore' });
  }
  const url = `postgresql://${user}@/postgres?host=${dir}&port=${port}`;
  if (await reachable(url)) return url;
  execFileSync(
    join(bin, 'pg_ctl'),
    [
      '-D',
      dir,
      '-l',
      join(dir, 'server.log'),
      '-w',
      '-o',
      `-p ${port} -k ${dir} -c listen_addresses='' -c max_connections=${MAX_CONNECTIONS}`,
      'start',
    ],
    { stdio: 'ignore' },
  );
  return (await reachable(url)) ? url : undefined;
}

/** A connection string for a reachable PostgreSQL server, starting one if need be. */
export async function ensurePostgres() {
  if (process.env.DATABASE_URL) {
    if (await reachable(process.env.DATABASE_URL)) return process.env.DATABASE_URL;
    throw new Error('DATABASE_URL is set but the server does not answer');
  }
  const user = userInfo().username;
  const local = `postgresql://${user}@/postgres?host=/var/run/postgresql`;
  if (await reachable(local)) return local;
  const started = user === 'root' ? await startSystemCluster(user) : await startPrivateCluster(user);
  if (started) return started;
  return undefined;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const url = await ensurePostgres();
  if (!url) {
    console.error('No PostgreSQL server found or startable (install postgresql, or set DATABASE_URL).');
    process.exit(1);
  }
  console.log(url);
}
