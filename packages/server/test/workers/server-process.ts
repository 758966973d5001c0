/**
 * A run-server process for the multi-process tests: one `echo` agent against the provider
 * at PROVIDER_URL, state in DATABASE_URL, settings from the environment. Prints
 * `listening <url>` once it accepts runs.
 */
import { createAgent } from 'sluice';
import { defineConfig, serve } from '@sluice/server';

const config = defineConfig({
  agents: {
    echo: createAgent({
      model: { api: 'openai-completions', provider: 'stand-in', id: 'm', baseUrl: process.env.PROVIDER_URL! },
      credentials: { apiKey: 'k' },
    }),
  },
});
const server = await serve({ config, port: 0, databaseUrl: process.env.DATABASE_URL });
console.log(`listening ${server.url}`);
process.once('SIGTERM', () => void server.close().then(() => process.exit(0)));
