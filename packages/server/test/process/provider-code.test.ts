import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const server = fileURLToPath(new URL('../../src/index.ts', import.meta.url));
const register = fileURLToPath(new URL('./fixtures/module-log-register.mjs', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'sluice-provider-code-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
// The child gets no NODE_OPTIONS (the test runner's could add warnings of its own).
const { NODE_OPTIONS: _, ...env } = process.env;

/**
 * Starts a server (embedded PGlite) whose agents use `apis`, in a fresh process that logs every
 * module it loads; answers which of pi-ai's provider modules were loaded when `serve()` resolved.
 */
function providerModulesAtReady(
  apis: string[],
  name: string,
  fail?: string,
): { loaded: string[]; failedAgain: string[] } {
  const log = join(dir, `${name}.log`);
  const agents = apis
    .map(
      (api, i) =>
        `a${i}: createAgent({ model: { api: ${JSON.stringify(api)}, provider: 'p', id: 'm', baseUrl: 'http://127.0.0.1:9' }, credentials: { apiKey: 'k' } })`,
    )
    .join(', ');
  const code = `
    import { readFileSync } from 'node:fs';
    import { createAgent, loadProviderCode } from 'sluice';
    import { defineConfig, serve } from ${JSON.stringify(server)};
    const server = await serve({
      config: defineConfig({ agents: { ${agents} } }),
      port: 0, dataDir: ${JSON.stringify(join(dir, name))}, databaseUrl: '', logger: false,
    });
    const loaded = readFileSync(${JSON.stringify(log)}, 'utf8').split('\\n')
      .filter((url) => /pi-ai\\/dist\\/providers\\//.test(url))
      .map((url) => url.replace(/.*\\/providers\\//, ''));
    // What a second try finds: a module that failed to load is still missing.
    const again = await loadProviderCode(${JSON.stringify(apis)});
    console.log(JSON.stringify({ loaded, failedAgain: again.failed.map((f) => f.api) }));
    await server.close();`;
  const out = spawnSync(
    process.execPath,
    [
      '--conditions=@sluice/source',
      '--import',
      'tsx',
      '--import',
      register,
      '--input-type=module',
      '-e',
      code,
    ],
    {
      encoding: 'utf8',
      env: { ...env, MODULE_LOG: log, ...(fail ? { MODULE_FAIL: fail } : {}) },
      timeout: 60_000,
    },
  );
  expect(out.stderr).not.toMatch(/Error/);
  expect(out.status).toBe(0);
  return JSON.parse(out.stdout.trim().split('\n').at(-1)!) as { loaded: string[]; failedAgain: string[] };
}

describe('a started server has the provider code of its agents loaded', () => {
  it('loads the module of each API its agents use before serve() resolves, and no other', () => {
    const { loaded, failedAgain } = providerModulesAtReady(
      ['openai-completions', 'anthropic-messages'],
      'two',
    );
    expect(failedAgain).toEqual([]);
    expect(loaded).toContain('openai-completions.js');
    expect(loaded).toContain('anthropic.js');
    // Only what the agents use: a server of OpenAI agents does not load Google's or Mistral's SDK.
    expect(loaded.filter((m) => /google|mistral|bedrock/.test(m))).toEqual([]);
  });

  it('starts when a module fails to load, and leaves that API to fail at its first request', () => {
    // Anthropic's SDK missing from the install: the start goes on, and that API's module is
    // still not loaded after it (pi-ai's own import at the first request fails the same way).
    const { loaded, failedAgain } = providerModulesAtReady(
      ['openai-completions', 'anthropic-messages'],
      'failing',
      'anthropic-ai/sdk',
    );
    expect(loaded).toContain('openai-completions.js');
    expect(failedAgain).toEqual(['anthropic-messages']);
  });
});
