/**
 * The packages' build (dist/), for what runs on it rather than on the sources: bench:gateway
 * and bench:stream start their measured server on the build, as users run it, not on the
 * sources through tsx's transform; the tarball tests pack it. The test run brings it up to date
 * once before any test (vitest-global-setup.ts), so that the tests' own builds find nothing to
 * write and none of them reads a file another is writing.
 */
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../', import.meta.url));

/** Brings every package's build up to date with its sources: `tsc -b`, about a second when nothing changed. */
export function buildPackages(): void {
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  execFileSync(process.execPath, [tsc, '-b', 'tsconfig.build.json'], { cwd: root, stdio: 'inherit' });
}

/**
 * The environment of a bench's child that must run the build: the parent's, without
 * NODE_OPTIONS, which could carry `--conditions=@sluice/source` and put the sources back.
 */
export function buildEnv(env: Record<string, string>): NodeJS.ProcessEnv {
  const { NODE_OPTIONS: _dropped, ...rest } = process.env;
  return { ...rest, ...env };
}
