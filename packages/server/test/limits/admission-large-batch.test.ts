import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { requestLimits } from '../../src/http/limits.js';
import { admitRun, type Admission } from '../../src/runs/admission.js';
import type { TenantLimits } from '../../src/runs/policy.js';
import { MAX_STATEMENT_JSON_CHARS } from '../../src/runs/run-documents.js';
import type { NewRun } from '../../src/runs/store.js';
import type { Principal } from '../../src/store/tokens.js';
import { afterThisTest, freshDatabase, postgres } from '../helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/*
 * Every run of an admission batch goes to PostgreSQL as jsonb. Control characters take six
 * characters each in JSON text, so runs within the request limits (1,000,000 characters of input)
 * make about 6 MB of text each: a batch of 90 once passed V8's longest string (a RangeError that
 * failed every run of the batch), and ~45 passed PostgreSQL's jsonb limit (54000). A batch is now
 * written in statements of at most MAX_STATEMENT_JSON_CHARS; eight such runs take two.
 */
const limits: TenantLimits = { activePerTenant: 0, activePerProject: 0, deferredQueued: 0, scheduled: 0 };
const who = (project: string): Principal => ({
  tokenId: 'tok',
  tenant: 'big',
  project,
  user: 'u',
  role: 'member',
});
const run = (input: string): NewRun => ({
  agent: 'echo',
  class: 'default',
  mode: 'queued',
  input,
  metadata: {},
  worker: 'w1',
});

describeWith({ PostgreSQL: postgres })('one jsonb text per admission batch', () => {
  it('a small run batched with large (but allowed) runs of another project is still admitted', async () => {
    const url = await freshDatabase();
    const dir = mkdtempSync(join(tmpdir(), 'sluice-r15-'));
    const store = await openStore({ databaseUrl: url, dataDir: dir, statementTimeoutMs: 60_000 });
    afterThisTest(async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    });
    const big = '\u0001'.repeat(requestLimits.textChars);
    const settle = (p: Promise<Admission>) =>
      p.then(
        (a) => (a.ok ? 'admitted' : 'refused'),
        (error: unknown) => `error: ${String(error).slice(0, 60)}`,
      );
    // All in one tick: one batch.
    const small = settle(admitRun(store.db, who('other'), run('hello'), limits));
    const large = Array.from({ length: 8 }, () => settle(admitRun(store.db, who('bulk'), run(big), limits)));
    expect(big.length * 6 * 8).toBeGreaterThan(MAX_STATEMENT_JSON_CHARS);
    expect(await small).toBe('admitted');
    expect(await Promise.all(large)).toEqual(Array(8).fill('admitted'));
    // In the order asked for, across the statements.
    const order = await store.db.query<{ project: string }>(
      `SELECT project FROM agent_runs WHERE tenant = 'big' ORDER BY seq`,
    );
    expect(order.rows.map((r) => r.project)).toEqual(['other', ...Array(8).fill('bulk')]);
  }, 60_000);
});
