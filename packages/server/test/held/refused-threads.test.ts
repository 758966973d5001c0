// A refused request leaves no row it created (review row R45): the thread an AG-UI front makes
// on the first use of a client's thread id, and the thread a Responses follow-up makes for its
// chain, are removed when the request is then refused; a thread that was there before stays.
// Over real HTTP, on PostgreSQL.
import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { postgres, startTestServer, until, type Reply, type TestServer } from '../helpers.js';

interface Counts {
  threads: number;
  messages: number;
}

async function counts(t: TestServer): Promise<Counts> {
  const { rows } = await t.server.store.db.query<Counts>(
    `SELECT (SELECT count(*)::int FROM threads) AS threads, (SELECT count(*)::int FROM thread_messages) AS messages`,
  );
  return rows[0]!;
}

const threadOfRun = async (t: TestServer, id: string): Promise<string | null> =>
  (
    await t.server.store.db.query<{ thread_id: string | null }>(
      'SELECT thread_id FROM agent_runs WHERE id = $1::text',
      [id],
    )
  ).rows[0]!.thread_id;

const agUi = (threadId: string, runId: string) => ({
  threadId,
  runId,
  messages: [
    { id: 'm1', role: 'user', content: 'an earlier question' },
    { id: 'm2', role: 'assistant', content: 'an earlier answer' },
    { id: 'm3', role: 'user', content: 'and now?' },
  ],
});

/** A server whose project may have one active run, and that run, stalled at the provider. */
async function atItsCap(t: TestServer, token: string): Promise<string> {
  const stalled = await t.call('POST', '/agents/echo/runs', { input: 'stall', wait: false }, token);
  expect(stalled.status).toBe(202);
  await until(() => t.provider.inFlight === 1, 'the stalled run holds the cap');
  return stalled.body.id as string;
}

const expectCapRefusal = (reply: Reply) => {
  expect(reply.status).toBe(429);
  expect(reply.body.error).toMatchObject({ code: 'agent_run_concurrency_limit', limit: 'max_active_runs' });
};

describeWith({ PostgreSQL: postgres })('a refused request removes the thread it created', () => {
  it("AG-UI: the thread of a client's new thread id is gone after a 429, a thread used before stays with its messages", async () => {
    const t = await startTestServer({ database: 'postgres', settings: { maxActivePerProject: 1 } });
    const token = await t.token({ tenant: 'a', project: 'p', role: 'member' });
    // A thread in use before the cap is reached: the resent history (2), then the run's turn and answer.
    const used = await t.call('POST', '/agents/echo/ag-ui', agUi('client-old', 'r0'), token, {
      anyBody: true,
    });
    expect(used.status).toBe(200);
    await until(async () => (await counts(t)).messages === 4, 'the first run appended its turn');
    const before = await counts(t);
    expect(before).toEqual({ threads: 1, messages: 4 });

    await atItsCap(t, token);
    expectCapRefusal(await t.call('POST', '/agents/echo/ag-ui', agUi('client-new', 'r1'), token));
    expect(await counts(t)).toEqual(before);
    expectCapRefusal(await t.call('POST', '/agents/echo/ag-ui', agUi('client-old', 'r2'), token));
    expect(await counts(t)).toEqual(before);
  }, 60_000);

  it('Responses: the chain thread of a first follow-up is gone after a 429 (streamed, background or waited), and the chain still works after', async () => {
    const t = await startTestServer({ database: 'postgres', settings: { maxActivePerProject: 1 } });
    const token = await t.token({ tenant: 'a', project: 'p', role: 'member' });
    const first = await t.call('POST', '/responses', { model: 'agent:echo', input: 'first' }, token);
    expect(first.body).toMatchObject({ status: 'completed' });
    // A chain whose thread exists before the cap is reached.
    const other = await t.call('POST', '/responses', { model: 'agent:echo', input: 'other' }, token);
    const followed = await t.call(
      'POST',
      '/responses',
      { model: 'agent:echo', input: 'more', previous_response_id: other.body.id },
      token,
    );
    expect(followed.body).toMatchObject({ status: 'completed' });
    const before = await counts(t);
    expect(before.threads).toBe(1);

    const stalled = await atItsCap(t, token);
    for (const how of [{ stream: true }, { background: true }, {}]) {
      const refused = await t.call(
        'POST',
        '/responses',
        { model: 'agent:echo', input: 'again', previous_response_id: first.body.id, ...how },
        token,
      );
      expectCapRefusal(refused);
      expect(await counts(t)).toEqual(before);
      expect(await threadOfRun(t, first.body.id)).toBeNull();
    }
    // A follow-up of the chain that had its thread already: the thread stays.
    expectCapRefusal(
      await t.call(
        'POST',
        '/responses',
        { model: 'agent:echo', input: 'again', previous_response_id: followed.body.id },
        token,
      ),
    );
    expect(await counts(t)).toEqual(before);

    // Room again: the refused follow-up, sent again, makes its thread and continues the chain.
    expect((await t.call('POST', `/agents/runs/${stalled}/cancel`, undefined, token)).status).toBe(200);
    const retried = await t.call(
      'POST',
      '/responses',
      { model: 'agent:echo', input: 'again', previous_response_id: first.body.id },
      token,
    );
    expect(retried.body).toMatchObject({ status: 'completed' });
    expect(await threadOfRun(t, first.body.id)).not.toBeNull();
    expect((await counts(t)).threads).toBe(2);
  }, 60_000);
});
