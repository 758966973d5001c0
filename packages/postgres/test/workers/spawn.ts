import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../../../', import.meta.url));

export type Worker = ChildProcess & {
  /** Everything the worker printed, once it exits with 0 (rejects otherwise). */
  output: Promise<string>;
  /** Resolves with the first line of output that satisfies `test`. */
  line(test: (line: string) => boolean): Promise<string>;
};

/**
 * Starts a TypeScript worker in its own Node process, on the workspace sources. `script` is a
 * URL, or a path relative to this folder. With `stdin`, the test can write lines to it.
 */
export function spawnWorker(
  script: string | URL,
  env: Record<string, string>,
  options: { stdin?: boolean } = {},
): Worker {
  const path = fileURLToPath(typeof script === 'string' ? new URL(script, import.meta.url) : script);
  const child = spawn(process.execPath, ['--conditions=@sluice/source', '--import', 'tsx', path], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: [options.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const output = new Promise<string>((resolve, reject) => {
    child.on('exit', (code, signal) => {
      if (code === 0) resolve(out);
      else reject(new Error(`worker ${path} exited with ${code ?? signal}: ${err || out}`));
    });
  });
  output.catch(() => undefined);
  const line = (test: (line: string) => boolean) =>
    new Promise<string>((resolve, reject) => {
      const check = () => {
        const found = out.split('\n').find((l) => l.trim() && test(l.trim()));
        if (found) {
          child.stdout!.off('data', check);
          resolve(found.trim());
        }
      };
      // Registered after the accumulating listener, so `out` already holds the new chunk.
      child.stdout!.on('data', check);
      child.once('exit', () => reject(new Error(`worker exited before printing the line: ${err || out}`)));
      check();
    });
  return Object.assign(child, { output, line });
}
