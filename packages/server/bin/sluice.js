#!/usr/bin/env node
// The `sluice` command: the built CLI when there is one, else the TypeScript sources (in this
// repository) through tsx, in a child process that resolves workspace packages to their sources.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const built = new URL('../dist/cli.js', import.meta.url);
if (existsSync(built)) {
  await import(built.href);
} else {
  const source = fileURLToPath(new URL('../src/cli.ts', import.meta.url));
  const child = spawnSync(
    process.execPath,
    ['--conditions=@sluice/source', '--import', 'tsx', source, ...process.argv.slice(2)],
    { stdio: 'inherit' },
  );
  process.exit(child.status ?? 1);
}
