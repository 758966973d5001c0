import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../helpers.js';

/**
 * A member token cancels only its own project's runs (POST /agents/runs/:id/cancel answers 403
 * for another project's run). A run with `thread_id` and `on_busy: 'cancel'` cancels the
 * thread's active run with no such check (threads/hold.ts -> runs/cancel.ts).
 */
describe('on_busy cancel and the cancel permission', () => {
  it("a member of project p2 cannot cancel p1's run through a thread with on_busy: 'cancel'", async () => {
    const provider = await startProviderStandIn({
      reply: (r) => (lastUserText(r).includes('stall') ? { stall: true } : { text: 'ok' }),
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider, runs: { threadBusyWaitMs: 0 } });
    const alice = await t.token({ project: 'p1', user: 'alice', role: 'member' });
    const mallory = await t.token({ project: 'p2', user: 'mallory', role: 'member' });

    const thread = (await t.call('POST', '/threads', {}, alice)).body.id as string;
    const aliceRun = t.call('POST', '/agents/echo/runs', { input: 'stall', thread_id: thread }, alice);
    await until(() => provider.inFlight === 1, "alice's run at the provider");
    const running = (await t.call('GET', '/agents/runs?status=running', undefined, alice)).body.data;
    const id = running[0].id as string;

    // The direct way is refused.
    const direct = await t.call('POST', `/agents/runs/${id}/cancel`, {}, mallory);
    expect(direct.status).toBe(403);
    expect((await t.statusOf(id)).status).toBe('running');

    // The thread way is not.
    const viaThread = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: 'mine now', thread_id: thread, on_busy: 'cancel' },
      mallory,
    );
    // Fails: 200, and alice's run was canceled by a token that may not cancel it.
    expect((await t.statusOf(id)).status).toBe('running');
    expect(viaThread.status).not.toBe(200);

    await t.call('POST', `/agents/runs/${id}/cancel`, {}, alice);
    await aliceRun;
  });
});
