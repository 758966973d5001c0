import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['**/node_modules/**', '**/dist/**', '**/.sluice/**', 'coverage/**'] },
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
      ],
    },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: {
      globals: { process: 'readonly', console: 'readonly', setTimeout: 'readonly', URL: 'readonly' },
    },
  },
);
