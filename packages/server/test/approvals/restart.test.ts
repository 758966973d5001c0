import { describe, expect, it } from 'vitest';
import { startProviderStandIn, type StandInRequest } from '@sluice/testkit';
import { afterThisTest, freshDatabase } from '../helpers.js';
import { answerAll, bankReply, startApprovalServer, type ToolLog } from './harness.js';

describe('a paused run across a restart', () => {
  it('survives the server closing: a new server on the same database resumes it and the run finishes with the tool result', async () => {
    const databaseUrl = await freshDatabase();
    const requests: StandInRequest[] = [];
    const provider = await startProviderStandIn({
      reply: (r) => {
        requests.push(r);
        return bankReply(r);
      },
    });
    afterThisTest(() => provider.close());
    const log: ToolLog = [];

    const first = await startApprovalServer({ provider, log, databaseUrl });
    const thread = (await first.call('POST', '/threads', {})).body.id as string;
    const paused = (await first.call('POST', '/agents/bank/runs', { input: 'pay 42', thread_id: thread }))
      .body;
    expect(paused.status).toBe('requires_action');
    await first.close();

    const second = await startApprovalServer({ provider, log, databaseUrl });
    afterThisTest(() => second.close());
    // Nothing of the pause was lost or ended by the restart: no worker held it, no lease ran out.
    const seen = (await second.call('GET', `/agents/runs/${paused.id}`)).body;
    expect(seen).toMatchObject({ status: 'requires_action', required_action: paused.required_action });
    expect((await second.call('GET', `/threads/${thread}`)).body.status).toBe('requires_action');

    const done = await second.call('POST', `/agents/runs/${paused.id}/resume`, {
      approvals: answerAll(paused, true),
    });
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({
      status: 'succeeded',
      output: { text: 'Checking. told: sent 42 | balance 900' },
    });
    expect(log).toEqual(['lookup', 'transfer 42']);
    const messages = (await second.call('GET', `/threads/${thread}/messages`)).body.data as {
      content: unknown;
    }[];
    expect(messages.map((m) => m.content)).toEqual(['pay 42', 'Checking. told: sent 42 | balance 900']);
    // The model's second request carried the first turn and both results.
    const last = requests.at(-1)!.messages;
    expect(requests).toHaveLength(2);
    expect(
      last
        .filter((m) => m.role === 'tool')
        .map((m) => m.tool_call_id)
        .sort(),
    ).toEqual(['call_l', 'call_t']);
  });
});
