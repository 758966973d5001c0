import js from '@eslint/js';
import { createTypeScriptImportResolver } from 'eslint-import-resolver-typescript';
import importX from 'eslint-plugin-import-x';
import tseslint from 'typescript-eslint';

/**
 * The server's layers: domain and infrastructure code answers in its own terms (typed results,
 * refusals with codes), and only the HTTP layer turns that into statuses and bodies. So these
 * folders may not reach up into `http/` or `routes/`.
 */
const serverLowerLayers = ['runs', 'threads', 'cache', 'callbacks', 'media'].map(
  (folder) => `packages/server/src/${folder}/**/*.ts`,
);

export default tseslint.config(
  {
    ignores: [
      '**/node_modules/**',
      '**/dist/**',
      '**/.sluice/**',
      'coverage/**',
      'packages/client/src/generated/**',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
      'no-restricted-syntax': [
        'error',
        { selector: 'TSEnumDeclaration', message: 'Use an `as const` object or a union, not an enum.' },
      ],
    },
  },
  {
    // One clock per server process (see packages/server/src/clock.ts): time is read through it,
    // so tests can drive it. The rule is replaced, not merged, per file set: the enum entry repeats.
    files: ['packages/server/src/**/*.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        { selector: 'TSEnumDeclaration', message: 'Use an `as const` object or a union, not an enum.' },
        {
          selector: "MemberExpression[object.name='Date'][property.name='now']",
          message:
            "Read the time from the injected clock (a `Clock`, or sluice/concurrency's systemClock), not Date.now.",
        },
        {
          selector: "NewExpression[callee.name='Date'][arguments.length=0]",
          message: 'Read the time from the injected clock: `new Date(clock.now())`, not `new Date()`.',
        },
      ],
    },
  },
  {
    files: serverLowerLayers,
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^(\\.\\./)+(http|routes)(/|$)',
              message:
                'Domain and cache code do not import the HTTP layer: return a typed result or throw a domain refusal (runs/refused.ts), and map it in http/errors.ts.',
            },
          ],
        },
      ],
    },
  },
  {
    // Import cycles of value imports (import-x skips `import type` edges) in every package's
    // sources. The resolver follows `./x.js` to `x.ts` and workspace packages to their sources;
    // node_modules is not walked (a third of lint's time, and no cycle of ours runs through it).
    files: ['packages/*/src/**/*.ts'],
    plugins: { 'import-x': importX },
    settings: {
      'import-x/extensions': ['.ts', '.js'],
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts'] },
      'import-x/resolver-next': [createTypeScriptImportResolver({ project: 'tsconfig.json' })],
    },
    rules: { 'import-x/no-cycle': ['error', { ignoreExternal: true }] },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: {
      globals: { process: 'readonly', console: 'readonly', setTimeout: 'readonly', URL: 'readonly' },
    },
  },
);
