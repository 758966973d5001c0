/**
 * The bench's processes talk over Node's IPC channel: the parent starts a script with
 * {@link startChild} and sends it requests; the script answers them with {@link answerParent}.
 * Each message is `{ id, type, ...fields }`; an answer carries the same id.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { buildEnv } from '../../scripts/build-packages.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

type Message = { id?: number; type: string; error?: string } & Record<string, unknown>;

export interface Child {
  readonly process: ChildProcess;
  /** What the script said when it was ready (its first message). */
  readonly ready: Promise<Message>;
  request<T = Message>(type: string, fields?: Record<string, unknown>): Promise<T>;
  /** Asks the script to close what it opened and waits for the process to exit by itself. */
  stop(): Promise<void>;
  /** Ends the process at once: for servers whose workers hold model calls that never end. */
  kill(): Promise<void>;
}

/**
 * Starts `script` (a path under bench/) in its own Node process. The process runs the packages'
 * build (dist/), as users run them: without the source condition `sluice` and `@sluice/server`
 * resolve to their build, and tsx only loads the script's own few lines (its transform of the
 * sources wraps every named function as it is created, work no user's server does). The bench
 * brings the build up to date first (scripts/build-packages.ts).
 */
export function startChild(script: string, options: Record<string, unknown>): Child {
  // BENCH_CPU_PROF_DIR=dir: each process writes a CPU profile there when it exits (node --cpu-prof).
  const profile = process.env.BENCH_CPU_PROF_DIR
    ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF_DIR}`]
    : [];
  const child = spawn(
    process.execPath,
    [...profile, '--import', 'tsx', fileURLToPath(new URL(script, import.meta.url))],
    {
      cwd: root,
      env: buildEnv({ BENCH_CHILD_OPTIONS: JSON.stringify(options) }),
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    },
  );
  let next = 1;
  const pending = new Map<number, { resolve: (m: Message) => void; reject: (e: Error) => void }>();
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  const ready = new Promise<Message>((resolve, reject) => {
    child.once('message', (m: Message) => (m.error ? reject(new Error(m.error)) : resolve(m)));
    void exited.then(([code, signal]) => reject(new Error(`${script} exited with ${code ?? signal}`)));
  });
  ready.catch(() => undefined);
  child.on('message', (m: Message) => {
    const waiter = m.id === undefined ? undefined : pending.get(m.id);
    if (!waiter) return;
    pending.delete(m.id!);
    if (m.error) waiter.reject(new Error(`${script}: ${m.error}`));
    else waiter.resolve(m);
  });
  void exited.then(([code, signal]) => {
    for (const { reject } of pending.values()) reject(new Error(`${script} exited with ${code ?? signal}`));
    pending.clear();
  });
  const request = <T>(type: string, fields: Record<string, unknown> = {}) =>
    new Promise<T>((resolve, reject) => {
      const id = next++;
      pending.set(id, { resolve: resolve as (m: Message) => void, reject });
      child.send({ id, type, ...fields });
    });
  return {
    process: child,
    ready,
    request,
    async stop() {
      await request('stop');
      const [code, signal] = await exited;
      if (code !== 0) throw new Error(`${script} exited with ${code ?? signal} after stop`);
    },
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

/** The options the parent gave this process. */
export function childOptions<T>(): T {
  return JSON.parse(process.env.BENCH_CHILD_OPTIONS ?? '{}') as T;
}

type Handler = (message: Message) => Promise<Record<string, unknown> | void> | Record<string, unknown> | void;

/** What every child answers: `cpu`, the CPU time this process has used so far (µs). */
const builtIn: Record<string, Handler> = {
  cpu: () => {
    const { user, system } = process.cpuUsage();
    return { us: user + system };
  },
};

/**
 * Tells the parent this process is ready (with `readyFields`), then answers its requests with
 * `handlers`. `stop` runs the handler of that name, answers, and lets go of the channel, so
 * the process exits once the handler has closed everything else it opened.
 */
export function answerParent(readyFields: Record<string, unknown>, handlers: Record<string, Handler>): void {
  let stopping = false;
  // The parent died without a stop (killed, crashed): nothing will ever stop this process.
  process.once('disconnect', () => {
    if (!stopping) process.exit(1);
  });
  process.on('message', (m: Message) => {
    if (m.type === 'stop') stopping = true;
    void (async () => {
      try {
        const answer = (await (handlers[m.type] ?? builtIn[m.type])?.(m)) ?? {};
        process.send!({ id: m.id, type: m.type, ...answer });
        if (m.type === 'stop') process.disconnect();
      } catch (error) {
        process.send!({ id: m.id, type: m.type, error: (error as Error).stack ?? String(error) });
      }
    })();
  });
  process.send!({ type: 'ready', ...readyFields });
}

/** Reports a failed start to the parent (which rejects `ready`) instead of dying silently. */
export function failStart(error: unknown): void {
  process.send?.({ type: 'ready', error: (error as Error).stack ?? String(error) });
  process.exitCode = 1;
  process.disconnect?.();
}
