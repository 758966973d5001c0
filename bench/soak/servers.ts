/**
 * The soak's `sluice serve` processes, each on a fixed loopback port so a restarted one comes
 * back at the same address, and a load balancer's view of them: which answer `/readyz` 200.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { openSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../', import.meta.url));
const bin = join(root, 'packages/server/bin/sluice.js');
const config = fileURLToPath(new URL('./soak.config.ts', import.meta.url));

export interface SoakServer {
  readonly name: string;
  readonly url: string;
  /** The pid of the current process; undefined while it is down. */
  readonly pid: number | undefined;
  /** Every process this server has been, in order (for the memory samples). */
  readonly incarnations: readonly number[];
  start(): Promise<void>;
  /** SIGKILL: no drain, no goodbye. */
  kill9(): Promise<void>;
  /** SIGTERM: the drain, then the exit. */
  terminate(): Promise<void>;
  /** SIGKILL without waiting, for the soak's own exit. */
  kill(): void;
}

async function ready(url: string): Promise<boolean> {
  try {
    const response = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) });
    await response.arrayBuffer();
    return response.status === 200;
  } catch {
    return false;
  }
}

export function soakServer(name: string, port: number, env: NodeJS.ProcessEnv, logDir: string): SoakServer {
  const url = `http://127.0.0.1:${port}`;
  let child: ChildProcess | undefined;
  const incarnations: number[] = [];
  const log = openSync(join(logDir, `${name}.log`), 'a');
  const stopped = async (signal: NodeJS.Signals) => {
    const current = child;
    if (!current || current.exitCode !== null || current.signalCode !== null) return;
    const exited = once(current, 'exit');
    current.kill(signal);
    await exited;
    child = undefined;
  };
  return {
    name,
    url,
    get pid() {
      return child?.pid;
    },
    incarnations,
    async start() {
      const started = spawn(process.execPath, [bin, 'serve', '--port', String(port), '--config', config], {
        cwd: root,
        env,
        stdio: ['ignore', log, log],
      });
      child = started;
      incarnations.push(started.pid!);
      // Longer than the injector's 90 s wait for /readyz: a slow restart is counted there, not a crash here.
      const until = Date.now() + 120_000;
      while (Date.now() < until) {
        if (started.exitCode !== null)
          throw new Error(`${name} exited (${started.exitCode}) while starting; see ${logDir}/${name}.log`);
        if (await ready(url)) return;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      throw new Error(`${name} was not ready within 120 s; see ${logDir}/${name}.log`);
    },
    kill9: () => stopped('SIGKILL'),
    terminate: () => stopped('SIGTERM'),
    kill: () => child?.kill('SIGKILL'),
  };
}

/** What a load balancer knows: the servers that answered `/readyz` 200 at the last check. */
export class Balancer {
  readonly #servers: readonly SoakServer[];
  #ready = new Set<SoakServer>();
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(servers: readonly SoakServer[]) {
    this.#servers = servers;
    this.#ready = new Set(servers);
  }

  start(everyMs = 500): void {
    this.#timer = setInterval(() => void this.check(), everyMs);
  }

  async check(): Promise<void> {
    const states = await Promise.all(this.#servers.map(async (s) => [s, await ready(s.url)] as const));
    this.#ready = new Set(states.filter(([, ok]) => ok).map(([s]) => s));
  }

  /** Takes a server out at once (the balancer's health check would a moment later). */
  remove(server: SoakServer): void {
    this.#ready.delete(server);
  }

  /** A ready server, chosen by `pick`; undefined when none is. */
  choose(pick: (n: number) => number): SoakServer | undefined {
    const ready = [...this.#ready];
    return ready.length === 0 ? undefined : ready[pick(ready.length)];
  }

  /** Whether every server answers `/readyz` 200 now. */
  async allReady(): Promise<boolean> {
    const states = await Promise.all(this.#servers.map((s) => ready(s.url)));
    return states.every(Boolean);
  }

  stop(): void {
    clearInterval(this.#timer);
  }
}
