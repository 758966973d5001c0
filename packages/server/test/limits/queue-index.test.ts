import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Database } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { claimDefaultRun } from '../../src/runs/claims.js';
import { afterThisTest, freshDatabase, postgres } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

interface PlanNode {
  'Node Type': string;
  'Index Name'?: string;
  'Rows Removed by Filter'?: number;
  'Actual Rows'?: number;
  'Actual Loops'?: number;
  Plans?: PlanNode[];
}

const nodesOf = (plan: PlanNode): PlanNode[] => [plan, ...(plan.Plans ?? []).flatMap(nodesOf)];

/**
 * The plan PostgreSQL executes for the default-class claim, as written in the store: the claim
 * (whose first statement lists the waiting tenants in turn order) is run through a handle that prefixes its statement with EXPLAIN (ANALYZE, FORMAT JSON).
 */
async function claimPlan(db: Pick<Database, 'query'>): Promise<PlanNode[]> {
  let plan: PlanNode | undefined;
  const explaining = {
    // The claim's first statement picks the candidate: that is the plan looked at.
    query: async (text: string, params?: unknown[]) => {
      const r = await db.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
        `EXPLAIN (ANALYZE, FORMAT JSON) ${text}`,
        params,
      );
      plan ??= r.rows[0]!['QUERY PLAN'][0].Plan;
      return { rows: [] };
    },
    transaction: (work: (tx: unknown) => Promise<unknown>) => work(explaining),
  } as unknown as Database;
  await claimDefaultRun(explaining, 'node_me');
  return nodesOf(plan!);
}

const removedByFilter = (nodes: PlanNode[]) =>
  nodes.reduce((n, node) => n + (node['Rows Removed by Filter'] ?? 0), 0);

describeWith({ PostgreSQL: postgres })('on PostgreSQL', () => {
  it('M11: with 10,000 queued deferred runs, the default-class claim reads the partial index agent_runs_queue_default_tenant and filters out none of them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sluice-queue-index-'));
    const store = await openStore({ dataDir: dir, databaseUrl: await freshDatabase() });
    afterThisTest(async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    });
    // The deferred backlog is older than the default-class runs: in one shared queue order, a
    // claim would walk past all of it first.
    await store.db.query(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input)
       SELECT 'run_' || substr(md5('d' || g), 1, 24), 'tenant' || (g % 50), 'p', 'u', 'echo', 'deferred', 'queued', 'queued', '"x"'
       FROM generate_series(1, 10000) g`,
    );
    await store.db.query(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input)
       SELECT 'run_' || substr(md5('i' || g), 1, 24), 'chat', 'p', 'u', 'echo', 'default', 'queued', 'queued', '"hi"'
       FROM generate_series(1, 3) g`,
    );
    await store.db.query('ANALYZE agent_runs');

    const nodes = await claimPlan(store.db);
    expect(nodes.map((n) => n['Index Name'])).toContain('agent_runs_queue_default_tenant');
    expect(removedByFilter(nodes)).toBe(0);

    // The same claim over the one queue index both classes used to share walks the backlog:
    // the measure above can tell (rolled back).
    const shared = await store.db
      .transaction(async (tx) => {
        await tx.query('DROP INDEX agent_runs_queue_default');
        await tx.query('DROP INDEX agent_runs_queue_default_tenant');
        await tx.query('DROP INDEX agent_runs_active');
        await tx.query('DROP INDEX agent_runs_live');
        await tx.query(`CREATE INDEX agent_runs_queue ON agent_runs (seq) WHERE status = 'queued'`);
        throw Object.assign(new Error('roll back'), { nodes: await claimPlan(tx) });
      })
      .catch((error: { nodes: PlanNode[] }) => error.nodes);
    // Whichever way the planner then reads the queue, it walks past the whole backlog.
    expect(shared.map((n) => n['Index Name'])).not.toContain('agent_runs_queue_default_tenant');
    expect(removedByFilter(shared)).toBeGreaterThanOrEqual(10_000);
    expect(
      (await store.db.query(`SELECT 1 FROM pg_indexes WHERE indexname = 'agent_runs_queue_default_tenant'`))
        .rows,
    ).toHaveLength(1);
  }, 60_000);

  it('with 6,000 queued default-class runs of 3 tenants, the claim reads a few index entries per tenant, not the queue', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sluice-queue-index-'));
    const store = await openStore({ dataDir: dir, databaseUrl: await freshDatabase() });
    afterThisTest(async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    });
    await store.db.query(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input)
       SELECT 'run_' || substr(md5('q' || g), 1, 24), 'tenant' || (g % 3), 'p', 'u', 'echo', 'default', 'queued', 'queued', '"x"'
       FROM generate_series(1, 6000) g`,
    );
    await store.db.query('ANALYZE agent_runs');
    const nodes = await claimPlan(store.db);
    const scans = nodes.filter((n) => n['Index Name'] === 'agent_runs_queue_default_tenant');
    expect(scans.length).toBeGreaterThan(0);
    // Each probe of the skip scan stops at one entry: one per tenant, and one finding the end.
    const entriesRead = scans.reduce((n, s) => n + s['Actual Rows']! * s['Actual Loops']!, 0);
    expect(entriesRead).toBeLessThanOrEqual(3 + 1);
    expect(removedByFilter(nodes)).toBe(0);
  }, 60_000);
});
