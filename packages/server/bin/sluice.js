#!/usr/bin/env node
// The `sluice` command. The CLI always runs in this very process, never in a child: a process
// manager, a container's PID 1 or a shell signals the PID it started, and that must be the server.
//
// Which code runs:
// - installed (this file lies under node_modules, symlinks resolved): the build in dist/;
// - in a checkout of the repository: always the TypeScript sources, so that a dist/ left over
//   from an earlier build can never be what `npm start` or `node packages/server/bin/sluice.js`
//   runs. To try the build from a checkout, run `node packages/server/dist/cli.js` directly.
import { realpathSync } from 'node:fs';
import { register } from 'node:module';
import { sep } from 'node:path';
import { clearInterval, setInterval } from 'node:timers';
import { fileURLToPath } from 'node:url';

const terminations = ['SIGTERM', 'SIGINT', 'SIGHUP'];

// `npx sluice` and `npm run` start this process under `sh -c`. A SIGTERM sent to npm's PID ends
// npm and that shell but is not passed on, so this process would go on running, orphaned. When npm
// started it, losing the parent before any termination signal arrived therefore counts as a
// SIGTERM, which the CLI's own handler turns into a drain. Elsewhere a lost parent means nothing
// (`nohup sluice serve &` must outlive its shell).
function stopWhenOrphanedByNpm() {
  const parent = process.ppid;
  let signalled = false;
  for (const signal of terminations) {
    const note = () => {
      signalled = true;
      // Alone, this listener would swallow the signal: give it back its default action.
      if (process.listenerCount(signal) === 1) {
        process.off(signal, note);
        process.kill(process.pid, signal);
      }
    };
    process.on(signal, note);
  }
  const watch = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(watch);
    if (!signalled) process.kill(process.pid, 'SIGTERM');
  }, 500);
  watch.unref();
}

if (process.env.npm_lifecycle_event !== undefined) stopWhenOrphanedByNpm();

const installed = realpathSync(fileURLToPath(import.meta.url))
  .split(sep)
  .includes('node_modules');
if (installed) {
  await import('../dist/cli.js');
} else {
  // tsx's loader, in this process; then a resolve hook, which runs before tsx's, that adds the
  // `@sluice/source` condition so that workspace packages resolve to their src/ as well.
  const tsx = await import('tsx/esm/api').catch((error) => {
    console.error('sluice: running from a checkout needs its dev dependencies: run `npm install`.');
    throw error;
  });
  tsx.register();
  const addSourceCondition = `export async function resolve(specifier, context, next) {
    return next(specifier, { ...context, conditions: [...context.conditions, '@sluice/source'] });
  }`;
  register(`data:text/javascript,${encodeURIComponent(addSourceCondition)}`);
  await import('../src/cli.ts');
}
