import { parseArgs } from 'node:util';
import { resolve } from 'node:path';
import { loadConfig, serve } from './server.js';
import { openStore } from './store/store.js';
import { createToken, type Role } from './store/tokens.js';

const usage = `Usage:
  sluice serve [--config FILE] [--port N] [--host H]
  sluice tokens create --tenant T --project P --user U --role admin|member|read [--config FILE]`;

async function main(argv: string[]): Promise<void> {
  const [command, sub] = argv;
  if (command === 'serve') {
    const { values } = parseArgs({
      args: argv.slice(1),
      options: { config: { type: 'string' }, port: { type: 'string' }, host: { type: 'string' } },
    });
    const port = values.port === undefined ? 8787 : Number(values.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535)
      throw new Error(`Expected --port to be 0 to 65535, got ${values.port}`);
    const { config, source } = await loadConfig(values.config);
    const server = await serve({ config, port, host: values.host });
    // A local admin token so the first request can be pasted as it is.
    const token = await createToken(server.store.db, {
      tenant: 'local',
      project: 'default',
      user: 'local',
      role: 'admin',
    });
    const agent = Object.keys(config.agents)[0]!;
    console.log(`Sluice is serving ${Object.keys(config.agents).join(', ')} (${source}) on ${server.url}`);
    console.log(
      process.env.DATABASE_URL
        ? 'State: PostgreSQL (DATABASE_URL)'
        : `State: embedded PGlite in ${resolve('.sluice')}`,
    );
    console.log(
      `\nTry it:\n  curl -s ${server.url}/api/client/v1/agents/${agent}/runs \\\n    -H "Authorization: Bearer ${token.secret}" -H "Content-Type: application/json" \\\n    -d '{"input": "tides"}'\n`,
    );
    const stop = async () => {
      const interrupted = await server.drain();
      if (interrupted.length > 0)
        console.log(`Interrupted ${interrupted.length} runs that did not finish in time`);
      process.exit(0);
    };
    process.once('SIGINT', () => void stop());
    process.once('SIGTERM', () => void stop());
    return;
  }
  if (command === 'tokens' && sub === 'create') {
    const { values } = parseArgs({
      args: argv.slice(2),
      options: {
        tenant: { type: 'string' },
        project: { type: 'string' },
        user: { type: 'string' },
        role: { type: 'string' },
        config: { type: 'string' },
      },
    });
    for (const field of ['tenant', 'project', 'user', 'role'] as const) {
      if (!values[field]) throw new Error(`Missing --${field}\n${usage}`);
    }
    const store = await openStore({
      databaseUrl: process.env.DATABASE_URL,
      dataDir: resolve('.sluice', 'db'),
    });
    try {
      const token = await createToken(store.db, {
        tenant: values.tenant!,
        project: values.project!,
        user: values.user!,
        role: values.role as Role,
      });
      console.log(
        `Token ${token.id} for tenant ${values.tenant}, project ${values.project}, user ${values.user}, role ${values.role}.`,
      );
      console.log('The secret is shown once:');
      console.log(token.secret);
    } finally {
      await store.close();
    }
    return;
  }
  console.log(usage);
  process.exitCode = command === undefined || command === 'help' || command === '--help' ? 0 : 1;
}

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : String(error));
  process.exit(1);
});
