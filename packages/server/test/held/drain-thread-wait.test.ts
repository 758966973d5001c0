import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, startTestServer, until } from '../helpers.js';
import { gate } from '../process/harness.js';
import { openStream } from '../held/sse.js';

/**
 * On drain `RunWaiters.closeAll()` makes every later `wait`/`waitForThread` resolve 'closed' at
 * once (runs/waiters.ts `wait`). `holdThread` (threads/hold.ts) does not look at that result:
 * a held run waiting for a busy thread when the drain begins tries the thread again and again
 * with no pause, two statements a turn, until the thread frees or its wait runs out. On the
 * embedded store this also starves the process's event loop (timers fire seconds late).
 */
describe('a held run waiting for a thread during a drain', () => {
  it('keeps to its one-try-a-second pace instead of spinning on the database', async () => {
    const release = gate();
    const provider = await startProviderStandIn({
      reply: async () => {
        await release.promise;
        return { text: 'held answer' };
      },
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({
      provider,
      settings: { drainTimeoutMs: 30_000 },
      runs: { threadBusyWaitMs: 2_000 },
    });
    const url = `${t.server.url}/api/client/v1/agents/echo/runs`;
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const holder = await openStream(url, t.admin, { input: 'hold', stream: true, thread_id: thread });
    expect((await holder.next())!.event).toBe('run.created');
    await until(() => provider.inFlight === 1, 'the holder at the provider');

    // Count the thread-lock attempts from here on (the real database, only counted).
    const db = t.server.store.db;
    const query = db.query.bind(db);
    let attempts = 0;
    db.query = ((text: string, params?: unknown[]) => {
      if (typeof text === 'string' && text.trimStart().startsWith('UPDATE threads t SET active_run_id'))
        attempts++;
      return query(text, params as never);
    }) as typeof db.query;

    const waiting = t.call('POST', '/agents/echo/runs', { input: 'next', thread_id: thread });
    await until(() => t.server.waiters.size === 1, 'the second run waiting for the thread');
    const draining = t.server.drain();
    // The waiter is answered as the drain begins (503 server_draining), then the holder ends and the drain completes.
    const answer = await waiting;
    expect(answer.status).toBe(503);
    expect(answer.body.error.code).toBe('server_draining');
    release.open();
    await draining;
    // About 2 s of waiting at one try a second (RETRY_MS): a handful of attempts.
    // Fails: thousands, as fast as the database answers.
    expect(attempts).toBeLessThan(20);
  });
});
