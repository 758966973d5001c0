/**
 * The soak's `sluice serve` processes, each on a fixed loopback port so a restarted one comes
 * back at the same address, and a load balancer's view of them: which answer `/readyz` 200.
 * Every exit the soak did not ask for is recorded (a crash, a start that failed), and so is a
 * drain that did not end within its bound (the process is then killed, so the soak goes on).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { openSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../', import.meta.url));
const bin = join(root, 'packages/server/bin/sluice.js');
const config = fileURLToPath(new URL('./soak.config.ts', import.meta.url));

/** An exit the soak did not ask for, or a drain that did not end in time. */
export interface ServerExit {
  server: string;
  pid: number | undefined;
  at: number;
  what: string;
}

export interface SoakServer {
  readonly name: string;
  readonly url: string;
  /** The pid of the current process; undefined while it is down. */
  readonly pid: number | undefined;
  /** Every process this server has been, in order (for the memory samples). */
  readonly incarnations: readonly number[];
  /** Exits nobody asked for, and drains killed for lasting too long. */
  readonly exits: readonly ServerExit[];
  /** Starts a process and waits for `/readyz` 200; false when it exited (recorded) or is not up yet. */
  start(): Promise<boolean>;
  /** SIGKILL: no drain, no goodbye. */
  kill9(): Promise<void>;
  /** SIGTERM: the drain, then the exit; killed (and recorded) after `drainBoundMs`. */
  terminate(): Promise<void>;
  /** SIGKILL without waiting, for the soak's own exit. */
  kill(): void;
}

export interface ServerOptions {
  env: NodeJS.ProcessEnv;
  logDir: string;
  /** The longest a SIGTERM drain may take before the process is killed and the drain counted. */
  drainBoundMs: number;
  /** How long a start may take to answer `/readyz` 200. */
  startTimeoutMs?: number;
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

export function soakServer(name: string, port: number, options: ServerOptions): SoakServer {
  const url = `http://127.0.0.1:${port}`;
  const { env, logDir, drainBoundMs } = options;
  // As long as the injector's wait for /readyz, which counts a slow restart.
  const startTimeoutMs = options.startTimeoutMs ?? 120_000;
  let child: ChildProcess | undefined;
  /** The processes the soak is stopping itself: their exits are expected. */
  const stopping = new WeakSet<ChildProcess>();
  const incarnations: number[] = [];
  const exits: ServerExit[] = [];
  const log = openSync(join(logDir, `${name}.log`), 'a');
  const record = (pid: number | undefined, what: string) =>
    exits.push({ server: name, pid, at: Date.now(), what });
  const stopped = async (signal: NodeJS.Signals, boundMs?: number) => {
    const current = child;
    if (!current || current.exitCode !== null || current.signalCode !== null) return;
    stopping.add(current);
    const exited = once(current, 'exit');
    current.kill(signal);
    if (boundMs === undefined) await exited;
    else {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = await Promise.race([
        exited.then(() => false),
        new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), boundMs))),
      ]);
      clearTimeout(timer);
      if (late) {
        record(current.pid, `the ${signal} drain had not ended after ${boundMs} ms: killed`);
        current.kill('SIGKILL');
        await exited;
      }
    }
    if (child === current) child = undefined;
  };
  return {
    name,
    url,
    get pid() {
      return child?.pid;
    },
    incarnations,
    exits,
    async start() {
      const started = spawn(process.execPath, [bin, 'serve', '--port', String(port), '--config', config], {
        cwd: root,
        env,
        stdio: ['ignore', log, log],
      });
      child = started;
      incarnations.push(started.pid!);
      started.once('exit', (code, signal) => {
        if (!stopping.has(started)) record(started.pid, `exited by itself (${signal ?? `code ${code}`})`);
        if (child === started) child = undefined;
      });
      const until = Date.now() + startTimeoutMs;
      while (Date.now() < until) {
        if (started.exitCode !== null || started.signalCode !== null) return false;
        if (await ready(url)) return true;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      // Still starting: not an exit; the injector counts the server not ready after its fault.
      return false;
    },
    kill9: () => stopped('SIGKILL'),
    terminate: () => stopped('SIGTERM', drainBoundMs),
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
