/**
 * The packages' build (dist/), for what runs on it rather than on the sources: bench:gateway
 * and bench:stream start their measured server on the build, as users run it, not on the
 * sources through tsx's transform; the tarball test packs it.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../', import.meta.url));

/** Brings every package's build up to date with its sources: `tsc -b`, about a second when nothing changed. */
export function buildPackages(): void {
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  execFileSync(process.execPath, [tsc, '-b', 'tsconfig.build.json'], { cwd: root, stdio: 'inherit' });
}

/**
 * Builds when a package has no build at all (a fresh checkout's first `npm test`), so that the
 * tests that need one do not each start building it at the same time. A build that is only
 * older than the sources is left to those tests (each brings it up to date first): building
 * before every test run would cost an edit-and-test loop the whole incremental build.
 */
export function buildWhenMissing(): void {
  const packages = join(root, 'packages');
  const unbuilt = readdirSync(packages).some(
    (name) => existsSync(join(packages, name, 'package.json')) && !existsSync(join(packages, name, 'dist')),
  );
  if (unbuilt) buildPackages();
}
