/**
 * Resource samples of every server process (resident memory, open file descriptors) and of the
 * database (its sessions), taken on an interval, and the growth rule the checker applies.
 */
import { readdirSync, readFileSync } from 'node:fs';
import pg from 'pg';
import type { SoakServer } from './servers.js';

export interface ProcessSample {
  pid: number;
  server: string;
  at: number;
  rssMb: number;
  fds: number;
}

export interface Samples {
  processes: ProcessSample[];
  /** Database sessions of the soak's database, at each sample. */
  sessions: { at: number; count: number }[];
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

/** Samples every `everyMs` until `stop()`; the first sample is taken at once. */
export function startSampling(
  servers: readonly SoakServer[],
  postgresUrl: string,
  database: string,
  everyMs: number,
) {
  const samples: Samples = { processes: [], sessions: [] };
  const take = async () => {
    for (const server of servers) {
      const sample = server.pid === undefined ? undefined : sampleOf(server, server.pid);
      if (sample) samples.processes.push(sample);
    }
    const client = new pg.Client({ connectionString: postgresUrl, connectionTimeoutMillis: 2000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      const { rows } = await client.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1',
        [database],
      );
      samples.sessions.push({ at: Date.now(), count: rows[0]!.n });
    } catch {
      // the database is down for a fault: no sample this time
    } finally {
      await client.end().catch(() => undefined);
    }
  };
  void take();
  const timer = setInterval(() => void take(), everyMs);
  return { samples, take, stop: () => clearInterval(timer) };
}

/**
 * Growth without bound, judged per process: of a process sampled at least four times, the last
 * sample against the one a third of the way through its life. Memory may settle after start
 * (JIT, pools, caches), so growth counts only when it is both large and relative: more than
 * 1.5x and more than 150 MB; file descriptors when more than 2x and more than 200 more. The
 * database's sessions the same way (more than 2x and more than 100 more).
 */
export function unboundedGrowth(samples: Samples): string[] {
  const found: string[] = [];
  const byPid = new Map<number, ProcessSample[]>();
  for (const s of samples.processes) byPid.set(s.pid, [...(byPid.get(s.pid) ?? []), s]);
  for (const [pid, list] of byPid) {
    if (list.length < 4) continue;
    const early = list[Math.floor(list.length / 3)]!;
    const last = list[list.length - 1]!;
    if (last.rssMb > early.rssMb * 1.5 && last.rssMb - early.rssMb > 150)
      found.push(
        `${last.server} (pid ${pid}): memory ${early.rssMb.toFixed(0)} -> ${last.rssMb.toFixed(0)} MB`,
      );
    if (last.fds > early.fds * 2 && last.fds - early.fds > 200)
      found.push(`${last.server} (pid ${pid}): file descriptors ${early.fds} -> ${last.fds}`);
  }
  const sessions = samples.sessions;
  if (sessions.length >= 4) {
    const early = sessions[Math.floor(sessions.length / 3)]!.count;
    const last = sessions[sessions.length - 1]!.count;
    if (last > early * 2 && last - early > 100) found.push(`database sessions ${early} -> ${last}`);
  }
  return found;
}
