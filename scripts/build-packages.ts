/**
 * Brings every package's build (dist/) up to date with its sources: `tsc -b`, about a second
 * when nothing changed. The test run does it once before any test (vitest-global-setup.ts), so
 * the tests that start a build (a bench's server, a packed tarball) never race to write it;
 * bench:gateway and bench:stream do it too, as they start their measured server on the build,
 * as users run it, not on the sources through tsx's transform.
 */
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../', import.meta.url));

export function buildPackages(): void {
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  execFileSync(process.execPath, [tsc, '-b', 'tsconfig.build.json'], { cwd: root, stdio: 'inherit' });
}
