import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { toDatabase, type Database } from '@sluice/postgres/database';
import { watchRun } from '../../src/runs/watching.js';
import { migrate } from '../../src/store/store.js';
import { afterThisTest, deliveries, endRun, insertRun, openDatabase, postgres } from './helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

const url = 'https://hooks.example.com/in';

async function countFor(db: Database, runId: string): Promise<number> {
  const r = await db.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM callback_deliveries WHERE run_id = $1::text',
    [runId],
  );
  return r.rows[0]!.n;
}

describeWith({ PostgreSQL: postgres })('the callback outbox trigger', () => {
  it('queues exactly one delivery for each way a run can end', async () => {
    const { db } = await openDatabase();
    const cases: [string, string, 'succeeded' | 'failed' | 'canceled', string?][] = [
      ['running', 'succeeded', 'succeeded'],
      ['running', 'failed agent_error', 'failed', 'agent_error'],
      ['queued', 'failed expired', 'failed', 'expired'],
      ['scheduled', 'failed expired (never due in time)', 'failed', 'expired'],
      ['running', 'failed worker_lost', 'failed', 'worker_lost'],
      ['running', 'failed interrupted', 'failed', 'interrupted'],
      ['queued', 'canceled while queued', 'canceled'],
      ['scheduled', 'canceled while scheduled', 'canceled'],
      ['running', 'canceled while running', 'canceled'],
      ['requires_action', 'canceled while paused', 'canceled'],
    ];
    const ids: string[] = [];
    for (const [from, , to, errorType] of cases) {
      const id = await insertRun(db, { status: from, callbackUrl: url });
      expect(await countFor(db, id)).toBe(0);
      await endRun(db, id, to, errorType);
      ids.push(id);
    }
    const rows = await deliveries(db);
    expect(rows.map((r) => r.run_id).sort()).toEqual([...ids].sort());
    for (const row of rows) {
      expect(row).toMatchObject({ state: 'pending', attempts: 0, lease: null });
      expect(row.id).toMatch(/^msg_[0-9a-f]{32}$/);
    }
    const copied = await db.query<{ tenant: string; url: string }>(
      'SELECT DISTINCT tenant, url FROM callback_deliveries',
    );
    expect(copied.rows).toEqual([{ tenant: 't', url }]);
  });

  it('queues nothing for a run without callback_url, or for a move between live states', async () => {
    const { db } = await openDatabase();
    const silent = await insertRun(db, { status: 'queued' });
    await endRun(db, silent, 'succeeded');
    const live = await insertRun(db, { status: 'scheduled', callbackUrl: url });
    for (const status of ['queued', 'running', 'requires_action', 'running']) {
      await db.query('UPDATE agent_runs SET status = $2::text WHERE id = $1::text', [live, status]);
    }
    expect(await deliveries(db)).toEqual([]);
  });

  it('queues no second delivery when an ended run is written again, changes terminal state, or even runs again', async () => {
    const { db } = await openDatabase();
    const id = await insertRun(db, { status: 'running', callbackUrl: url });
    await endRun(db, id, 'succeeded');
    await db.query(`UPDATE agent_runs SET usage = '{"cost": 1}'::jsonb WHERE id = $1::text`, [id]);
    await endRun(db, id, 'succeeded');
    await endRun(db, id, 'canceled');
    // Back to a live state and ended once more: the unique run_id keeps it to one.
    await db.query(`UPDATE agent_runs SET status = 'running' WHERE id = $1::text`, [id]);
    await endRun(db, id, 'failed', 'worker_lost');
    expect(await countFor(db, id)).toBe(1);
  });

  it('tells every process when it queued a delivery, and only then (callback:<run id>)', async () => {
    const { db } = await openDatabase();
    const listener = new pg.Client({ ...postgres });
    await listener.connect();
    afterThisTest(() => listener.end());
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query('LISTEN sluice_runs');
    const called = await insertRun(db, { status: 'running', callbackUrl: url });
    const silent = await insertRun(db, { status: 'running' });
    // Waited on (sql/035_watched_runs.sql): its end is announced too; the silent one's is not.
    await watchRun(db, called);
    await endRun(db, called, 'succeeded');
    await endRun(db, silent, 'succeeded');
    // Written again: no second delivery, so no second notification either.
    await endRun(db, called, 'canceled');
    // A statement on the listening session after the commits: what they sent has arrived.
    await listener.query('SELECT 1');
    const ours = heard.filter((p) => p.endsWith(called) || p.endsWith(silent));
    expect(ours).toEqual([`end:${called}`, `callback:${called}`]);
  });

  it('queues a delivery for a run inserted already ended', async () => {
    const { db } = await openDatabase();
    const id = await insertRun(db, { status: 'failed', callbackUrl: url });
    expect(await countFor(db, id)).toBe(1);
    expect(await countFor(db, await insertRun(db, { status: 'failed' }))).toBe(0);
  });

  it('writes the delivery in the transaction that ends the run: a rollback leaves neither', async () => {
    const { db } = await openDatabase();
    const id = await insertRun(db, { status: 'running', callbackUrl: url });
    await expect(
      db.transaction(async (tx) => {
        await tx.query(`UPDATE agent_runs SET status = 'succeeded' WHERE id = $1::text`, [id]);
        const seen = await tx.query<{ n: number }>('SELECT count(*)::int AS n FROM callback_deliveries');
        expect(seen.rows[0]!.n).toBe(1);
        throw new Error('abort the end of the run');
      }),
    ).rejects.toThrow('abort the end of the run');
    expect(await countFor(db, id)).toBe(0);
    const run = await db.query<{ status: string }>('SELECT status FROM agent_runs WHERE id = $1::text', [id]);
    expect(run.rows[0]!.status).toBe('running');
  });

  it('ends many runs in one statement (as expiry and worker_lost sweeps do) with one delivery each', async () => {
    const { db } = await openDatabase();
    const ids = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        insertRun(db, { status: 'running', callbackUrl: i % 4 === 0 ? null : url }),
      ),
    );
    await db.query(
      `UPDATE agent_runs SET status = 'failed', error = '{"type": "worker_lost", "message": "x"}'::jsonb
       WHERE id = ANY($1::text[])`,
      [ids],
    );
    expect((await deliveries(db)).length).toBe(15);
  });

  it('removes the deliveries of a deleted run', async () => {
    const { db } = await openDatabase();
    const id = await insertRun(db, { status: 'running', callbackUrl: url });
    await endRun(db, id, 'succeeded');
    await db.query('DELETE FROM agent_runs WHERE id = $1::text', [id]);
    expect(await deliveries(db)).toEqual([]);
  });
});

describe('the callback outbox on embedded PGlite', () => {
  // Starting PGlite compiles its WebAssembly: seconds on a quiet machine, tens on a busy one.
  it('migrates and queues one delivery per ended run', { timeout: 90_000 }, async () => {
    const pglite = new PGlite();
    try {
      const db = toDatabase(pglite);
      await migrate(db);
      const id = await insertRun(db, { status: 'running', callbackUrl: url });
      await endRun(db, id, 'failed', 'interrupted');
      await endRun(db, id, 'failed', 'interrupted');
      expect(await countFor(db, id)).toBe(1);
    } finally {
      await pglite.close();
    }
  });
});
