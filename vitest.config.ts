import { defineConfig } from 'vitest/config';

// Tests run on the TypeScript sources: the `@sluice/source` export condition points each
// workspace package at its `src/` instead of its build output.
const conditions = ['@sluice/source', 'import', 'module', 'node', 'default'];

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions, externalConditions: ['@sluice/source'] } },
  test: {
    include: ['packages/*/test/**/*.test.ts', 'examples/**/*.test.ts'],
    testTimeout: 20_000,
    hookTimeout: 30_000,
  },
});
