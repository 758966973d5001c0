import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Database } from '@sluice/postgres/database';
import { openStore } from '@sluice/server';
import type { TenantLimits } from '../../src/runs/policy.js';
import type { NewRun } from '../../src/runs/store.js';
import type { Principal } from '../../src/store/tokens.js';
import { afterThisTest } from '../helpers.js';

/** What the admission tests call `admitRun` with: limits (0: no cap), a member, a queued run. */

export const limits = (over: Partial<TenantLimits> = {}): TenantLimits => ({
  activePerTenant: 0,
  activePerProject: 0,
  deferredQueued: 0,
  scheduled: 0,
  ...over,
});

export const who = (tenant: string, project = 'p'): Principal => ({
  tokenId: 'tok',
  tenant,
  project,
  user: 'u',
  role: 'member',
});

export const run = (over: Partial<NewRun> = {}): NewRun => ({
  agent: 'echo',
  class: 'default',
  mode: 'queued',
  input: 'x',
  metadata: {},
  worker: 'w1',
  ...over,
});

/** A store on `databaseUrl` standing for one server process, closed after the test. */
export async function openDb(databaseUrl: string): Promise<Database> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-admission-'));
  const store = await openStore({ databaseUrl, dataDir: dir });
  afterThisTest(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return store.db;
}
