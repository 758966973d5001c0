import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { afterThisTest, freshDatabase, postgres } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * schema.sql beside this file is the server's schema as the migrations leave it (tables,
 * indexes, functions, triggers), so a reader sees what `agent_runs` is now without replaying
 * sixteen migrations. This test migrates an empty PostgreSQL database and fails when its dump
 * differs from the committed file. After changing a migration, write the file again with
 *
 *   SLUICE_UPDATE_SCHEMA=1 npx vitest run packages/server/test/schema/snapshot.test.ts
 *
 * and commit it with the migration.
 */

const schemaFile = fileURLToPath(new URL('./schema.sql', import.meta.url));
const lifecycleFile = fileURLToPath(new URL('../../src/runs/lifecycle.ts', import.meta.url));

const header = `-- The schema of @sluice/server after every migration in packages/server/sql, as pg_dump
-- --schema-only prints it. Generated: do not edit (see test/schema/snapshot.test.ts).
`;

/** An empty database on this run's PostgreSQL, migrated as a server's first boot does it. */
async function migratedDatabase(): Promise<string> {
  const url = await freshDatabase();
  const dataDir = mkdtempSync(join(tmpdir(), 'sluice-schema-'));
  const store = await openStore({ databaseUrl: url, dataDir });
  afterThisTest(async () => rmSync(dataDir, { recursive: true, force: true }));
  await store.close();
  return url;
}

function dump(url: string): string {
  const result = spawnSync('pg_dump', ['--schema-only', '--no-owner', '--no-privileges', url], {
    encoding: 'utf8',
  });
  if (result.error || result.status !== 0) {
    throw new Error(`pg_dump failed: ${String(result.error ?? result.stderr)}`);
  }
  // Lines that name the pg_dump version or carry a random key change from run to run.
  return result.stdout
    .split('\n')
    .filter((line) => !/^(\\restrict|\\unrestrict|-- Dumped (from|by) )/.test(line))
    .join('\n');
}

/** The statements alone: no comment lines of pg_dump's, no session settings, no blank runs. */
function statements(sql: string): string {
  return sql
    .split('\n')
    .filter((line) => !line.startsWith('--') && !/^(SET |SELECT pg_catalog\.set_config)/.test(line))
    .join('\n')
    .replace(/\n{2,}/g, '\n\n')
    .trim();
}

describeWith({ PostgreSQL: postgres })('the committed schema', () => {
  it('schema.sql is what the migrations make of an empty PostgreSQL database', async () => {
    const migrated = dump(await migratedDatabase());
    if (process.env.SLUICE_UPDATE_SCHEMA) writeFileSync(schemaFile, header + migrated);
    expect(statements(migrated)).toContain('CREATE TABLE public.agent_runs');
    expect(statements(readFileSync(schemaFile, 'utf8'))).toBe(statements(migrated));
  });

  it('the lifecycle header names every trigger on agent_runs and says what it does', async () => {
    const client = new pg.Client({ connectionString: await migratedDatabase() });
    await client.connect();
    const triggers = (
      await client
        .query<{ tgname: string }>(
          "SELECT tgname FROM pg_trigger WHERE tgrelid = 'agent_runs'::regclass AND NOT tgisinternal ORDER BY 1",
        )
        .finally(() => client.end())
    ).rows.map((r) => r.tgname);
    expect(triggers.length).toBeGreaterThanOrEqual(7);
    const drawing = readFileSync(lifecycleFile, 'utf8').split('*/')[0]!;
    for (const name of triggers)
      expect(drawing, `lifecycle.ts names ${name}`).toMatch(new RegExp(`\\b${name}\\b`));
  });
});
