// The checks before the tests, side by side: ESLint, Prettier and the type check each take
// half a minute or so, and one after another they kept a 2-core CI machine's second core idle.
// Each one's output is printed whole when it ends; the exit code is 1 if any failed.
import { spawn } from 'node:child_process';

const checks = [
  ['eslint', ['eslint', '.']],
  ['prettier', ['prettier', '--check', '.']],
  ['typecheck', ['tsc', '-p', 'tsconfig.json', '--noEmit']],
];

const results = await Promise.all(
  checks.map(
    ([name, [command, ...args]]) =>
      new Promise((resolve) => {
        const child = spawn('npx', ['--no-install', command, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
        let output = '';
        child.stdout.on('data', (chunk) => (output += chunk));
        child.stderr.on('data', (chunk) => (output += chunk));
        child.on('close', (code) => {
          process.stdout.write(`\n> ${name}: ${code === 0 ? 'ok' : `failed (${code})`}\n${output}`);
          resolve(code === 0);
        });
      }),
  ),
);
process.exit(results.every(Boolean) ? 0 : 1);
