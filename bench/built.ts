/**
 * Benches whose measured server runs in a child process start it on the packages' build
 * (dist/), as users run it, not on the TypeScript sources through tsx's transform. So they
 * build first: `tsc -b` brings dist/ up to date with the sources (about a second when nothing
 * changed), whether the bench was started by its npm script, by a test or by hand.
 */
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../', import.meta.url));

export function buildPackages(): void {
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  execFileSync(process.execPath, [tsc, '-b', 'tsconfig.build.json'], { cwd: root, stdio: 'inherit' });
}
