import { defaultServerConditions } from 'vite';
import { defineConfig } from 'vitest/config';
import SlowFirstSequencer from './scripts/vitest-sequencer.js';

// Tests run on the TypeScript sources: the `@sluice/source` export condition points each
// workspace package at its `src/` instead of its build output.
// Without `module`: Node's own resolution of external packages follows these too, and the
// OpenTelemetry API's `module` build has extensionless imports that Node cannot load.
const conditions = ['@sluice/source', ...defaultServerConditions.filter((c) => c !== 'module')];

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions } },
  test: {
    include: ['packages/*/test/**/*.test.ts', 'examples/**/*.test.ts', 'bench/**/*.test.ts'],
    globalSetup: ['scripts/vitest-global-setup.ts'],
    // The cleanup registry and, for the server's tests, the leak guard (see the file).
    setupFiles: ['packages/server/test/harness/setup.ts'],
    // Servers started by tests log only errors unless asked otherwise: the run stays readable.
    env: { SLUICE_LOG_LEVEL: process.env.SLUICE_LOG_LEVEL ?? 'error', MODE: 'development' },
    // Server tests boot an embedded PGlite (a WebAssembly PostgreSQL) per test: seconds on a busy 2-core box.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Most server tests wait on sockets, child processes and the database rather than the CPU:
    // more files at once than cores keeps a 2-core machine busy instead of idle.
    maxWorkers: 3,
    // A worker runs file after file with the modules it has loaded: loading the server's module
    // graph again for each of 200 files cost about four seconds a file. What a file starts it
    // closes (the cleanup registry and leak guard, packages/server/test/harness/), and module
    // state shared by files is reset when a file starts (timers.ts) or ends (callbacks/helpers.ts).
    isolate: false,
    // The files that take minutes go first (scripts/vitest-sequencer.ts).
    sequence: { sequencer: SlowFirstSequencer },
  },
});
