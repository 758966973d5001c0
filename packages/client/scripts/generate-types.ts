/**
 * Writes src/generated/openapi.ts from the OpenAPI document of a run server started here on an
 * embedded database (no port, no provider: the document depends on the routes alone).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createAgent } from 'sluice';
import { createApp, defineConfig, openStore, resolveSettings } from '@sluice/server';
import { renderTypes, typesFile } from './render-types.js';

const dir = mkdtempSync(join(tmpdir(), 'sluice-client-types-'));
const store = await openStore({ dataDir: join(dir, 'db') });
// An agent is required by the config; none is ever run here.
const model = {
  api: 'openai-completions' as const,
  provider: 'none',
  id: 'm',
  baseUrl: 'http://127.0.0.1:9',
};
const config = defineConfig({ agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) } });
const app = await createApp({ store, config, settings: resolveSettings({}, {}), logger: false });
try {
  const response = await app.fastify.inject({ method: 'GET', url: '/api/client/v1/openapi.json' });
  if (response.statusCode !== 200) throw new Error(`openapi.json answered ${response.statusCode}`);
  writeFileSync(typesFile, await renderTypes(response.json<object>()));
  console.log(`wrote ${typesFile.pathname}`);
} finally {
  await app.close();
  await store.close();
  rmSync(dir, { recursive: true, force: true });
}
