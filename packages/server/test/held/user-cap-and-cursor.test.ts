import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../helpers.js';

describe('the per-user cap and a deferred run the caller waits for', () => {
  it('a deferred run sent with wait: true holds its caller like an inline run, and counts for runs.maxConcurrentPerUser', async () => {
    const provider = await startProviderStandIn({
      reply: (r) => (lastUserText(r).includes('stall') ? { stall: true } : { text: 'ok' }),
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({
      provider,
      settings: { syncTimeoutMs: 1_000 },
      runs: { maxConcurrentPerUser: 1 },
    });
    const ann = await t.token({ user: 'ann', role: 'member' });
    const inline = t.call('POST', '/agents/echo/runs', { input: 'stall 1' }, ann);
    await until(() => provider.inFlight === 1, 'the inline run at the provider');
    // The same user's second held call: an inline one is refused...
    expect((await t.call('POST', '/agents/echo/runs', { input: 'x' }, ann)).status).toBe(429);
    // ...a deferred one with wait: true is held for the sync window all the same (routes/
    // create-run.ts: `held` is false for it, so it never takes a place).
    const deferred = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: 'stall 2', class: 'deferred', wait: true },
      ann,
    );
    // Fails: 202 after being held for AGENT_SYNC_TIMEOUT_MS.
    expect(deferred.status).toBe(429);
    for (const r of (await t.call('GET', '/agents/runs?status=running,queued')).body.data)
      await t.call('POST', `/agents/runs/${r.id}/cancel`);
    await inline;
  });
});

describe('the thread messages cursor', () => {
  it("does not carry a counter shared by every tenant (other tenants' activity shows through it)", async () => {
    const t = await startTestServer();
    const other = await t.token({ tenant: 'other' });
    const seqOf = (cursor: string) =>
      Number(/^m:(\d+)$/.exec(Buffer.from(cursor, 'base64url').toString())![1]);
    const firstCursor = async () => {
      const thread = (await t.call('POST', '/threads')).body.id as string;
      await t.call('POST', '/agents/echo/runs', { input: 'hi', thread_id: thread });
      return seqOf((await t.call('GET', `/threads/${thread}/messages?limit=1`)).body.next_cursor as string);
    };
    const before = await firstCursor();
    // Another tenant's conversation: 3 runs, 6 messages.
    const theirs = (await t.call('POST', '/threads', {}, other)).body.id as string;
    for (let i = 0; i < 3; i++)
      await t.call('POST', '/agents/echo/runs', { input: `secret ${i}`, thread_id: theirs }, other);
    const after = await firstCursor();
    // A cursor is a position within its own thread: the first page of a new thread has the same
    // cursor whatever other threads (of any tenant) did meanwhile. With a global sequence in it,
    // the other tenant's messages showed as a jump here.
    expect(after).toBe(before);
  });
});
