import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore, type Store } from '@sluice/server';
import { freshDatabase, preparedDataDir } from './database.js';
import { afterThisTest } from './registry.js';

/**
 * A store with no server, closed after the test: a copy of the migrated PGlite template, or
 * (`postgres`) a new database of this run's PostgreSQL, which the store migrates.
 */
export async function openTestStore(database: 'pglite' | 'postgres' = 'pglite'): Promise<Store> {
  const databaseUrl = database === 'postgres' ? await freshDatabase() : undefined;
  const dir = databaseUrl ? mkdtempSync(join(tmpdir(), 'sluice-store-test-')) : await preparedDataDir();
  const store = await openStore({ dataDir: join(dir, 'db'), databaseUrl });
  afterThisTest(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }, `the ${database} store`);
  return store;
}
