import { defaultServerConditions } from 'vite';
import { defineConfig } from 'vitest/config';

// Tests run on the TypeScript sources: the `@sluice/source` export condition points each
// workspace package at its `src/` instead of its build output.
const conditions = ['@sluice/source', ...defaultServerConditions];

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions } },
  test: {
    include: ['packages/*/test/**/*.test.ts', 'examples/**/*.test.ts'],
    globalSetup: ['scripts/vitest-global-setup.ts'],
    testTimeout: 20_000,
    hookTimeout: 30_000,
  },
});
