/**
 * The default-class run queue of the server, on PostgreSQL: tenant A has 250 runs queued and
 * one already claimed when tenant B queues one; counted: A's claims before B's. Arrival order
 * would put all 250 first; the tenants taking turns (packages/server/src/runs/claim-turns.ts)
 * put at most one. Also the mean time of one claim while A's backlog is queued.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore } from '@sluice/server';
import { claimDefaultRun } from '../../packages/server/src/runs/claims.js';

const backlog = 250;

export interface DefaultQueueFigures {
  queued: number;
  claimsBeforeB: number;
  claimMs: number;
}

const insertQueued = (tenant: string, n: number) =>
  `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input)
   SELECT 'run_' || substr(md5('${tenant}' || g), 1, 24), '${tenant}', 'p', 'u', 'echo', 'default', 'queued', 'queued', '"x"'
   FROM generate_series(1, ${n}) g ORDER BY g`;

export async function defaultQueue(databaseUrl: string): Promise<DefaultQueueFigures> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-queue-'));
  const store = await openStore({ databaseUrl, dataDir: dir });
  try {
    await store.db.query(insertQueued('a', backlog + 1));
    await store.db.query('ANALYZE agent_runs');
    await claimDefaultRun(store.db, 'bench');
    await store.db.query(insertQueued('b', 1));
    let claimsBeforeB = 1;
    const start = performance.now();
    let claims = 0;
    for (;;) {
      const row = await claimDefaultRun(store.db, 'bench');
      claims++;
      if (!row || row.tenant === 'b') break;
      claimsBeforeB++;
    }
    // The rest of A's backlog, for the time of one claim.
    for (let i = 0; i < 50; i++, claims++) await claimDefaultRun(store.db, 'bench');
    return { queued: backlog, claimsBeforeB, claimMs: (performance.now() - start) / claims };
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
