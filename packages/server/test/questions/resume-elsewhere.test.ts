import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { startProviderStandIn } from '@sluice/testkit';
import { freshDatabase, ownStandIn, postgres, until } from '../helpers.js';
import { conciergeReply, holdPauseEnds, startQuestionServer } from './harness.js';

// A run pauses on server A; a person answers through server B, whose worker takes the resumed
// run before A has stored the pause's last event (`run.requires_action`, written just after
// the pause row). The resumed run's events must be numbered after that event, not over it: two
// events under one id, and the store keeps only the first row it is given.
describeWith({ PostgreSQL: postgres })('a run resumed on another server', () => {
  it("numbers its events after the pause's last event, though that event is not stored yet", async () => {
    const databaseUrl = await freshDatabase();
    const provider = ownStandIn(await startProviderStandIn({ reply: conciergeReply }));
    const a = await startQuestionServer({ databaseUrl, provider, background: false });
    const b = await startQuestionServer({ databaseUrl, provider });
    const db = a.server.store.db;
    const held = await holdPauseEnds(databaseUrl);

    const paused = (await a.call('POST', '/agents/concierge/runs', { input: 'ask me' })).body;
    expect(paused.status).toBe('requires_action');
    const answered = await b.resume(paused.id, {
      answers: [{ tool_call_id: 'call_q', text: 'Oslo' }],
      wait: false,
    });
    expect(answered.status).toBe(202);
    await until(
      async () => (await b.statusOf(paused.id)).status === 'succeeded',
      'the resumed run ends on B',
    );
    await held.release();
    await a.server.executor.streams.flush();
    await b.server.executor.streams.flush();

    const { rows } = await db.query<{ seq: number; events: [string][] }>(
      'SELECT seq, events FROM agent_run_events WHERE run_id = $1::text ORDER BY seq',
      [paused.id],
    );
    const events = rows.flatMap((row) => row.events.map(([name], i) => ({ id: row.seq + i, name })));
    // Every id once, from 1 on, with no gap; the pause's end, then the resumed execution, then its end.
    expect(events.map((e) => e.id)).toEqual(events.map((_, i) => i + 1));
    const names = events.map((e) => e.name);
    expect(names.filter((n) => n === 'run.requires_action')).toHaveLength(1);
    expect(names[names.indexOf('run.requires_action') + 1]).toBe('run.started');
    expect(names.at(-1)).toBe('run.completed');
  });
});
