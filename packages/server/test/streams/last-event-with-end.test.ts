import { startProviderStandIn } from '@sluice/testkit';
import { describe, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { admitRun } from '../../src/runs/admission.js';
import { claimDeferredRun } from '../../src/runs/claims.js';
import { finishRun } from '../../src/runs/lifecycle.js';
import { insertEvents, type EventRow } from '../../src/streams/queries.js';
import { freshDatabase, postgres } from '../harness/index.js';
import { afterThisTest, startTestServer } from '../helpers.js';
import { limits, openDb, run, who } from '../limits/admission-fixtures.js';
import { getEvents, postStream, readEvents } from './sse-get.js';

// The event that ends a run's stream is stored by the statement that writes the run's end
// (runs/lifecycle.ts finishRun), not by a flush after it: a reader that sees the run ended has
// its whole stream, and a run's end costs no second write.

const answer = 'The last event is stored with the end of the run.';

describe('the last event of a run is stored with its end', () => {
  it('a streamed run: the run row and its last event are written by one transaction, and the replay is what was sent live', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ text: answer }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider });
    const live = await postStream(`${t.server.url}/api/client/v1/agents/echo/runs`, t.admin, {
      input: 'go',
      stream: true,
    });
    const last = live.at(-1)!;
    const lastId = Number(last.id);
    expect(last.event).toBe('run.completed');
    const runId = live[0]!.data.id as string;

    const { rows } = await t.server.store.db.query<{ same: boolean; stored: unknown }>(
      `SELECT r.xmin::text = e.xmin::text AS same, e.events -> -1 AS stored
       FROM agent_runs r JOIN agent_run_events e ON e.run_id = r.id
       WHERE r.id = $1 AND e.seq + jsonb_array_length(e.events) - 1 = $2`,
      [runId, lastId],
    );
    expect(rows).toHaveLength(1);
    expect(rows[0]!.same).toBe(true);
    expect((rows[0]!.stored as unknown[])[0]).toBe('run.completed');

    // Made from the run's row, the replayed last event is the live one, field for field.
    expect(await readEvents(await getEvents(t.server.url, t.admin, runId))).toEqual(live);
    expect(
      await readEvents(await getEvents(t.server.url, t.admin, runId, { after: String(lastId - 1) })),
    ).toEqual([last]);
  });

  it('the stored last event is the run as it ended, field for field, whatever its row holds (an error, metadata, a thread, a time it was due)', async () => {
    const t = await startTestServer();
    const thread = (await t.call('POST', '/threads', {})).body.id as string;
    const cases = [
      { input: 'fail', metadata: { team: 'a', n: 1 } },
      { input: 'hello', thread_id: thread },
      { input: 'later', wait: false, class: 'deferred', delay_seconds: 1, metadata: { k: 'v', on: true } },
    ];
    for (const body of cases) {
      const posted = await t.call('POST', '/agents/echo/runs', body);
      expect(posted.status, JSON.stringify(posted.body)).toBeLessThan(300);
      const id = posted.body.id as string;
      const events = await readEvents(await getEvents(t.server.url, t.admin, id));
      const run = (await t.call('GET', `/agents/runs/${id}`)).body;
      expect(['succeeded', 'failed']).toContain(run.status);
      expect(events.at(-1)).toEqual({
        id: events.length,
        event: run.status === 'failed' ? 'run.failed' : 'run.completed',
        data: run,
      });
    }
  });
});

describeWith({ PostgreSQL: postgres })('the end statement and the last event, on PostgreSQL', () => {
  it('an end fenced out (another worker, or an end written already) stores the events before the last, never the last', async () => {
    const db = await openDb(await freshDatabase());
    const admitted = await admitRun(db, who('acme'), run({ class: 'deferred' }), limits());
    if (!admitted.ok) throw new Error('refused');
    const id = admitted.run.id;
    expect((await claimDeferredRun(db, 'w1', 4))?.id).toBe(id);
    const started: EventRow = { run_id: id, seq: 2, events: [['run.started', { id, status: 'running' }]] };
    const stored = async () =>
      (
        await db.query<{ seq: number; events: unknown[] }>(
          'SELECT seq, events FROM agent_run_events WHERE run_id = $1 ORDER BY seq',
          [id],
        )
      ).rows;

    // Not this worker's run: its events are kept, the end and the last event are not.
    expect(
      await finishRun(db, id, 'w2', { status: 'succeeded', output: 'no' }, [started], 3),
    ).toBeUndefined();
    expect(await stored()).toEqual([{ seq: 2, events: [['run.started', { id, status: 'running' }]] }]);

    // Its own worker ends it: the last event in a row of its own, holding the run as it ended.
    const ended = await finishRun(db, id, 'w1', { status: 'succeeded', output: 'yes' }, [], 3);
    expect(ended).toMatchObject({ id, status: 'succeeded' });
    const rows = await stored();
    expect(rows.map((r) => r.seq)).toEqual([2, 3]);
    expect(rows[1]!.events).toEqual([
      [
        'run.completed',
        expect.objectContaining({ id, status: 'succeeded', finished_at: Math.floor(ended!.finished_at!) }),
      ],
    ]);

    // The same end again (its answer lost, say): nothing written, nothing changed; the event the
    // executor then flushes under the same id is kept once.
    expect(await finishRun(db, id, 'w1', { status: 'failed' }, [], 3)).toBeUndefined();
    await insertEvents(db, [{ run_id: id, seq: 3, events: [['run.completed', { id }]] }]);
    expect(await stored()).toEqual(rows);
    const row = (await db.query<{ status: string }>('SELECT status FROM agent_runs WHERE id = $1', [id]))
      .rows[0];
    expect(row?.status).toBe('succeeded');
  });
});
