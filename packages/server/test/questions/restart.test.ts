import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { startProviderStandIn, type StandInRequest } from '@sluice/testkit';
import { freshDatabase, ownStandIn, postgres } from '../helpers.js';
import { conciergeReply, startQuestionServer, type ToolLog } from './harness.js';

describeWith({ PostgreSQL: postgres })('a paused question across a restart', () => {
  it('a run waiting half-decided (approved, question open) is resumed by a new server on the same database and finishes with both results', async () => {
    const databaseUrl = await freshDatabase();
    const asked: StandInRequest[] = [];
    const provider = ownStandIn(
      await startProviderStandIn({
        reply: (r) => {
          asked.push(r);
          return conciergeReply(r);
        },
      }),
    );
    const log: ToolLog = [];

    const first = await startQuestionServer({ databaseUrl, provider, asked, log });
    const thread = (await first.call('POST', '/threads', {})).body.id as string;
    const paused = (
      await first.call('POST', '/agents/concierge/runs', { input: 'mixed stay', thread_id: thread })
    ).body;
    expect(paused.required_action.type).toBe('approve_tool_calls');
    const approved = await first.resume(paused.id, {
      approvals: [{ tool_call_id: 'call_b', approved: true }],
    });
    expect(approved.body.required_action).toMatchObject({ type: 'answer_question', tool_call_id: 'call_q' });
    await first.server.close();

    const second = await startQuestionServer({ databaseUrl, provider, asked, log });
    // Nothing of the pause was lost: the stage, the approval given, the thread held.
    expect((await second.call('GET', `/agents/runs/${paused.id}`)).body).toMatchObject({
      status: 'requires_action',
      required_action: approved.body.required_action,
    });
    expect((await second.call('GET', `/threads/${thread}`)).body.status).toBe('requires_action');
    const done = await second.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Vienna' }] });
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({
      status: 'succeeded',
      output: { text: 'One moment. told: booked 2 | Vienna' },
    });
    expect(log).toEqual(['book 2']);
    expect(asked).toHaveLength(2);
    const messages = (await second.call('GET', `/threads/${thread}/messages`)).body.data as {
      content: unknown;
    }[];
    expect(messages.map((m) => m.content)).toEqual(['mixed stay', 'One moment. told: booked 2 | Vienna']);
  });
});
