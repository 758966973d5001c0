import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { pruneEvents } from '../../src/streams/queries.js';
import { afterThisTest, startTestServer, until } from '../helpers.js';
import { gate } from '../process/harness.js';
import { getEvents, postStream, readEvents } from './sse-get.js';

const answer = 'Streams that can be resumed carry an id on every event, in order, from one.';

describe('stored run events (GET /agents/runs/:id/events)', () => {
  it('a streamed run: ids 1..n on every event; the store replays the same events, and from Last-Event-ID or ?after= only the rest', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ text: answer }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider });
    const live = await postStream(`${t.server.url}/api/client/v1/agents/echo/runs`, t.admin, {
      input: 'go',
      stream: true,
    });
    expect(live.map((e) => e.id)).toEqual(live.map((_, i) => i + 1));
    expect(live[0]!.event).toBe('run.created');
    expect(live.at(-1)!.event).toBe('run.completed');
    const runId = live[0]!.data.id as string;

    const replay = await getEvents(t.server.url, t.admin, runId);
    expect(replay.status).toBe(200);
    expect(replay.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(await readEvents(replay)).toEqual(live);

    const fromHeader = await readEvents(await getEvents(t.server.url, t.admin, runId, { lastEventId: '3' }));
    expect(fromHeader).toEqual(live.slice(3));
    const fromQuery = await readEvents(await getEvents(t.server.url, t.admin, runId, { after: '3' }));
    expect(fromQuery).toEqual(live.slice(3));
    // After the last event there is nothing more: the stream ends at once.
    const past = await getEvents(t.server.url, t.admin, runId, { after: String(live.length) });
    expect(await readEvents(past)).toEqual([]);
  });

  it('a queued run is followed live from run.created, on a reader opened before it started', async () => {
    const release = gate();
    const provider = await startProviderStandIn({
      reply: async () => {
        await release.promise;
        return { text: answer };
      },
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider });
    const queued = await t.call('POST', '/agents/echo/runs', { input: 'later', wait: false });
    expect(queued.status).toBe(202);
    const reading = getEvents(t.server.url, t.admin, queued.body.id as string).then(readEvents);
    release.open();
    const events = await reading;
    expect(events.map((e) => e.event)).toEqual([
      'run.created',
      'run.started',
      ...events.slice(2, -1).map(() => 'message.delta'),
      'run.completed',
    ]);
    expect(events.map((e) => e.id)).toEqual(events.map((_, i) => i + 1));
    expect(events[0]!.data).toMatchObject({ id: queued.body.id, status: 'queued', input: 'later' });
    expect(events.at(-1)!.data).toMatchObject({ status: 'succeeded', output: { text: answer } });
    expect(
      events
        .filter((e) => e.event === 'message.delta')
        .map((e) => e.data.text)
        .join(''),
    ).toBe(answer);
  });

  it('a run canceled before it started ends its stream with run.canceled, made from the run row', async () => {
    const t = await startTestServer();
    const scheduled = await t.call('POST', '/agents/echo/runs', {
      input: 'x',
      wait: false,
      delay_seconds: 3600,
    });
    expect(scheduled.status).toBe(202);
    const id = scheduled.body.id as string;
    expect((await t.call('POST', `/agents/runs/${id}/cancel`)).status).toBe(200);
    const events = await readEvents(await getEvents(t.server.url, t.admin, id));
    expect(events.map((e) => [e.id, e.event])).toEqual([
      [1, 'run.created'],
      [2, 'run.canceled'],
    ]);
    expect(events[1]!.data).toMatchObject({ id, status: 'canceled' });
    // Every reader makes the same last event.
    expect(await readEvents(await getEvents(t.server.url, t.admin, id, { after: '1' }))).toEqual(
      events.slice(1),
    );
  });

  it('answers 404 for an unknown id or another tenant’s run, 400 naming the field for a bad id, 410 past SLUICE_STREAM_RETENTION_MS', async () => {
    const t = await startTestServer();
    const done = await t.call('POST', '/agents/echo/runs', { input: 'hi' });
    expect(done.status).toBe(200);
    const id = done.body.id as string;
    const error = async (response: Response) => ({
      status: response.status,
      ...((await response.json()) as { error: object }).error,
    });

    expect(await error(await getEvents(t.server.url, t.admin, 'run_000000000000000000000000'))).toMatchObject(
      { status: 404, type: 'not_found' },
    );
    expect(await error(await getEvents(t.server.url, t.admin, '__proto__'))).toMatchObject({ status: 404 });
    const other = await t.token({ tenant: 'someone-else' });
    expect(await error(await getEvents(t.server.url, other, id))).toMatchObject({
      status: 404,
      type: 'not_found',
    });
    for (const bad of ['-1', 'abc', '1.5', '99999999999']) {
      expect(await error(await getEvents(t.server.url, t.admin, id, { lastEventId: bad }))).toMatchObject({
        status: 400,
        param: 'Last-Event-ID',
      });
      expect(await error(await getEvents(t.server.url, t.admin, id, { after: bad }))).toMatchObject({
        status: 400,
        param: 'after',
      });
    }
    expect(await error(await getEvents(t.server.url, t.admin, id, { after: '500' }))).toMatchObject({
      status: 400,
      param: 'after',
    });
    expect(
      await error(await getEvents(t.server.url, t.admin, id, { after: '2', lastEventId: '3' })),
    ).toMatchObject({ status: 400 });

    // Ended an hour ago (the row moved back in time): past the ten-minute window.
    await t.server.store.db.query(
      `UPDATE agent_runs SET finished_at = finished_at - interval '1 hour' WHERE id = $1`,
      [id],
    );
    expect(await error(await getEvents(t.server.url, t.admin, id))).toMatchObject({
      status: 410,
      type: 'run_events_expired',
    });
    // Upkeep deletes them; a live run's events stay.
    const live = await t.call('POST', '/agents/echo/runs', { input: 'y', wait: false, delay_seconds: 3600 });
    const stored = async (runId: string) =>
      (await t.server.store.db.query(`SELECT 1 FROM agent_run_events WHERE run_id = $1`, [runId])).rows
        .length;
    await until(
      async () => (await stored(live.body.id as string)) > 0,
      'the scheduled run’s run.created stored',
    );
    expect(await stored(id)).toBeGreaterThan(0);
    expect(await pruneEvents(t.server.store.db, 600_000, 500)).toBeGreaterThan(0);
    expect(await stored(id)).toBe(0);
    expect(await stored(live.body.id as string)).toBe(1);
  });
});
