import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';
import { splitSqlStatements } from '@sluice/postgres/database';
import { openStore, type Store } from '@sluice/server';
import { RunEvents } from '../../src/runs/events.js';
import { RunWaiters } from '../../src/runs/waiters.js';
import { claimDeferredRun } from '../../src/runs/claims.js';
import { markWatched, watchRun } from '../../src/runs/watching.js';
import { insertEvents } from '../../src/streams/queries.js';
import { describeWith } from '../../../../scripts/service-suites.js';
import { gate } from '../process/harness.js';
import { openStream } from '../held/sse.js';
import { afterThisTest, freshDatabase, postgres, startTestServer } from '../helpers.js';

/**
 * NOTIFY is sent for the runs somebody waits on or reads (sql/035_watched_runs.sql): a
 * transaction that notifies holds the database's one NOTIFY lock through its commit, so
 * announcing every run's end made all ends commit one at a time.
 */

/** A store on a new PostgreSQL database, and a session that LISTENs on its channel. */
async function storeAndListener(): Promise<{
  store: Store;
  url: string;
  heard: string[];
  settle: () => Promise<void>;
  blocked: () => Promise<void>;
}> {
  const databaseUrl = await freshDatabase();
  const dir = mkdtempSync(join(tmpdir(), 'sluice-watched-test-'));
  const store = await openStore({ dataDir: join(dir, 'db'), databaseUrl });
  const listener = new pg.Client({ connectionString: databaseUrl });
  await listener.connect();
  afterThisTest(async () => {
    await listener.end();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }, 'the store and its listener');
  const heard: string[] = [];
  listener.on('notification', (n) => heard.push(n.payload ?? ''));
  await listener.query('LISTEN sluice_runs');
  // A statement on the listening session after a commit: what the commit sent has arrived
  // (notifications of other sessions are delivered in commit order, before its answer).
  return {
    store,
    url: databaseUrl,
    heard,
    settle: async () => void (await listener.query('SELECT 1')),
    // Until a session of this database waits for a row lock.
    blocked: async () => {
      for (;;) {
        const { rows } = await listener.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        if (rows[0]!.n > 0) return;
        await new Promise((r) => setTimeout(r, 5));
      }
    },
  };
}

let made = 0;
async function runningRun(store: Store): Promise<string> {
  const id = `run_watched_${process.pid}_${made++}`;
  await store.db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, mode, status, input, worker, started_at)
     VALUES ($1::text, 't', 'p', 'u', 'echo', 'queued', 'running', '"hi"'::jsonb, 'node_x', clock_timestamp())`,
    [id],
  );
  return id;
}

const end = (store: Store, id: string) =>
  store.db.query(
    `UPDATE agent_runs SET status = 'succeeded', finished_at = clock_timestamp() WHERE id = $1::text`,
    [id],
  );

const watched = async (db: { query: Store['db']['query'] }, id: string) =>
  (
    await db.query<{ watched: boolean }>(
      'SELECT EXISTS (SELECT 1 FROM run_watches WHERE run_id = $1::text) AS watched',
      [id],
    )
  ).rows[0]!.watched;

describeWith({ PostgreSQL: postgres })('watched runs: NOTIFY only for runs somebody waits on', () => {
  it('the end of a run nobody watches is not announced; the end of a watched one is', async () => {
    const { store, heard, settle } = await storeAndListener();
    const alone = await runningRun(store);
    const waitedOn = await runningRun(store);
    expect(await watchRun(store.db, waitedOn)).toBe('running');
    await end(store, alone);
    await end(store, waitedOn);
    await settle();
    expect(heard.filter((p) => p.startsWith('end:'))).toEqual([`end:${waitedOn}`]);
  });

  it('runs admitted before the migration are announced whoever waits (a server of the version before does not mark)', async () => {
    const { store, heard, settle } = await storeAndListener();
    const before = await runningRun(store);
    // 035 again, as on a database that had this run when it was first applied.
    const migration = readFileSync(new URL('../../sql/035_watched_runs.sql', import.meta.url), 'utf8');
    for (const statement of splitSqlStatements(migration)) await store.db.query(statement);
    const after = await runningRun(store);
    await end(store, before);
    await end(store, after);
    await settle();
    expect(heard.filter((p) => p.startsWith('end:'))).toEqual([`end:${before}`]);
  });

  it('an end of many runs in one statement takes 256 watch locks at most, not one per run', async () => {
    const { store, url, heard, settle } = await storeAndListener();
    await store.db.query(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, mode, status, input, worker, started_at)
       SELECT 'run_bulk_' || i, 't', 'p', 'u', 'echo', 'queued', 'running', '"hi"'::jsonb, 'node_gone', clock_timestamp()
       FROM generate_series(1, 3000) AS i`,
    );
    const marked = await runningRun(store);
    await watchRun(store.db, marked);
    // One lock per run filled PostgreSQL's lock table ("out of shared memory") past about
    // 12,000 runs ended at once (a lost node's runs): the locks the end holds, counted before
    // it commits.
    const ending = new pg.Client({ connectionString: url });
    await ending.connect();
    afterThisTest(() => ending.end());
    await ending.query('BEGIN');
    const ended = await ending.query(
      `UPDATE agent_runs SET status = 'failed', finished_at = clock_timestamp() WHERE status = 'running' RETURNING id`,
    );
    const locks = await ending.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`,
    );
    await ending.query('COMMIT');
    expect(ended.rows.length).toBe(3001);
    expect(locks.rows[0]!.n).toBeGreaterThan(0);
    expect(locks.rows[0]!.n).toBeLessThanOrEqual(256);
    await settle();
    expect(heard.filter((p) => p.startsWith('end:'))).toEqual([`end:${marked}`]);
  });

  it('a flush of events announces the watched runs among it, and only them', async () => {
    const { store, heard, settle } = await storeAndListener();
    const alone = await runningRun(store);
    const read = await runningRun(store);
    await watchRun(store.db, read);
    await insertEvents(store.db, [
      { run_id: alone, seq: 1, events: [['run.created', {}]] },
      { run_id: read, seq: 1, events: [['run.created', {}]] },
    ]);
    await settle();
    expect(heard.filter((p) => p.startsWith('events:'))).toEqual([`events:${read}`]);
  });

  it('a waiter whose run ended unannounced before it marked the run is answered by the mark, not by the shared look', async () => {
    const { store } = await storeAndListener();
    const id = await runningRun(store);
    // Ended on "another process" before anyone watched: no NOTIFY went out.
    await end(store, id);
    // The shared look is an hour away, and no LISTEN session: only the mark can answer.
    const waiters = new RunWaiters(store.db, new RunEvents(store.db), { pollMs: 3_600_000 });
    afterThisTest(() => waiters.closeAll());
    expect(await waiters.wait(id, { timeoutMs: 3_600_000 })).toBe('ended');
    // An ended run is not marked: nothing more will be announced of it.
    expect(await watched(store.db, id)).toBe(false);
  });

  it('a run being marked is not passed over by a claim (the mark locks no row of agent_runs)', async () => {
    const { store, url } = await storeAndListener();
    const id = `run_watched_${process.pid}_${made++}`;
    await store.db.query(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input)
       VALUES ($1::text, 't', 'p', 'u', 'echo', 'deferred', 'queued', 'queued', '"hi"'::jsonb)`,
      [id],
    );
    const other = new pg.Client({ connectionString: url });
    await other.connect();
    afterThisTest(() => other.end());
    // The mark's transaction stays open: before 035's watch lock, the mark held the run's row
    // and a claim's SKIP LOCKED passed over it, leaving the run queued until the next poll.
    await other.query('BEGIN');
    await markWatched(other, id);
    expect(await watched(other, id)).toBe(true);
    const claimed = await claimDeferredRun(store.db, 'node_claimer', 0);
    expect([claimed?.id, claimed?.status]).toEqual([id, 'running']);
    await other.query('COMMIT');
  });

  it('a mark racing an end: whichever commits first, the end is heard', async () => {
    const { store, url, heard, settle, blocked } = await storeAndListener();
    const other = new pg.Client({ connectionString: url });
    await other.connect();
    afterThisTest(() => other.end());

    // The end, uncommitted, holds the run's watch lock when the mark arrives: the mark waits
    // for it, then reads the ended row and says so.
    const first = await runningRun(store);
    await other.query('BEGIN');
    await other.query(
      `UPDATE agent_runs SET status = 'succeeded', finished_at = clock_timestamp() WHERE id = $1::text`,
      [first],
    );
    const marking = watchRun(store.db, first);
    await blocked();
    await other.query('COMMIT');
    expect(await marking).toBe('succeeded');

    // The mark, uncommitted, holds the lock when the end arrives: the end's trigger waits for
    // it, then finds the mark, and the end is announced.
    const second = await runningRun(store);
    await other.query('BEGIN');
    expect(await watchRun(other, second)).toBe('running');
    const ending = end(store, second);
    await blocked();
    await other.query('COMMIT');
    await ending;
    await settle();
    expect(heard.filter((p) => p.startsWith('end:'))).toEqual([`end:${second}`]);
  });
});

describeWith({ PostgreSQL: postgres })('watched runs on two server processes', () => {
  it('a caller waiting on one process for a run executing on the other marks it, and its end is announced', async () => {
    const toolMayReturn = gate();
    const provider = await startProviderStandIn({
      reply: toolThenAnswer(
        () => [{ name: 'lookup', arguments: { q: 'x' } }],
        () => 'done',
      ),
    });
    afterThisTest(() => provider.close());
    const agents = (model: Parameters<typeof createAgent>[0]['model']) => ({
      researcher: createAgent({
        model,
        credentials: { apiKey: 'k' },
        tools: [
          tool<{ q: string }>({
            name: 'lookup',
            description: 'Look something up',
            parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
            execute: async ({ q }) => {
              await toolMayReturn.promise;
              return `result-${q}`;
            },
          }),
        ],
      }),
    });
    const databaseUrl = await freshDatabase();
    const a = await startTestServer({ provider, databaseUrl, agents });
    const b = await startTestServer({ provider, databaseUrl, agents });
    const token = await a.token({ tenant: 'watch', role: 'member' });
    const listener = new pg.Client({ connectionString: databaseUrl });
    await listener.connect();
    afterThisTest(() => listener.end());
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query('LISTEN sluice_runs');

    // A streamed run executes on A, its own caller held there (no NOTIFY needed for it).
    const stream = await openStream(`${a.server.url}/api/client/v1/agents/researcher/runs`, token, {
      input: 'look',
      stream: true,
    });
    let runId = '';
    for (let e = await stream.next(); e; e = await stream.next()) {
      if (e.event === 'run.created') runId = e.data.id as string;
      if (e.event === 'tool.started') break;
    }
    const row = async () =>
      (
        await listener.query<{ watched: boolean; status: string }>(
          `SELECT EXISTS (SELECT 1 FROM run_watches WHERE run_id = $1::text) AS watched, status
           FROM agent_runs WHERE id = $1::text`,
          [runId],
        )
      ).rows[0]!;
    expect(await row()).toEqual({ watched: false, status: 'running' });

    // B's caller waits for it.
    const waiting = fetch(`${b.server.url}/api/client/v1/agents/runs/${runId}?wait_ms=30000`, {
      headers: { authorization: `Bearer ${token}` },
    });
    for (let i = 0; !(await row()).watched; i++) {
      if (i > 400) throw new Error('B never marked the run watched');
      await new Promise((r) => setTimeout(r, 25));
    }
    toolMayReturn.open();
    const answer = await waiting;
    expect(answer.status).toBe(200);
    expect(((await answer.json()) as { status: string }).status).toBe('succeeded');
    await listener.query('SELECT 1');
    expect(heard).toContain(`end:${runId}`);
    for (let e = await stream.next(); e; e = await stream.next());
  });
});
