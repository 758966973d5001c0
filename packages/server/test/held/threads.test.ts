import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, startTestServer, type Body } from '../helpers.js';

/** A stand-in that answers "answer N" and remembers what each request sent. */
async function recordingProvider() {
  const seen: { role: string; content: unknown }[][] = [];
  const provider = await startProviderStandIn({
    reply: (r) => {
      seen.push(r.messages.map((m) => ({ role: m.role, content: m.content })));
      const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
      if (last.includes('fail')) return { status: 400, message: 'refused' };
      return { text: `answer ${seen.length}` };
    },
  });
  afterThisTest(() => provider.close());
  return { provider, seen };
}

describe('threads', () => {
  it('a thread is created, read, and continued by runs: each run sees the conversation so far and appends its messages when it succeeds', async () => {
    const { provider, seen } = await recordingProvider();
    const t = await startTestServer({ provider });
    const created = await t.call('POST', '/threads', { metadata: { topic: 'billing' } });
    expect(created.status).toBe(201);
    expect(created.body).toEqual({
      id: expect.stringMatching(/^thr_[0-9a-f]{24}$/),
      object: 'thread',
      status: 'idle',
      created_at: expect.any(Number),
      metadata: { topic: 'billing' },
    });
    const id = created.body.id as string;
    expect((await t.call('GET', `/threads/${id}`)).body).toEqual(created.body);

    const first = await t.call('POST', '/agents/echo/runs', { input: 'hello', thread_id: id });
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ status: 'succeeded', output: { text: 'answer 1' }, thread_id: id });
    // `messages` instead of `input`, with a system message and blocks.
    const second = await t.call('POST', '/agents/echo/runs', {
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'and then?' }] },
      ],
      thread_id: id,
    });
    expect(second.body).toMatchObject({ status: 'succeeded', output: { text: 'answer 2' } });
    // The second request carried the first exchange before its own message.
    expect(seen[1]).toEqual([
      { role: 'system', content: expect.stringContaining('Be brief.') },
      { role: 'user', content: 'hello' },
      { role: 'assistant', content: 'answer 1' },
      { role: 'user', content: 'and then?' },
    ]);

    // A failed run appends nothing.
    const failed = await t.call('POST', '/agents/echo/runs', { input: 'please fail', thread_id: id });
    expect(failed.body.status).toBe('failed');

    const page = await t.call('GET', `/threads/${id}/messages`);
    expect(page.status).toBe(200);
    expect(page.body.data.map((m: Body) => [m.role, m.content, m.run_id])).toEqual([
      ['user', 'hello', first.body.id],
      ['assistant', 'answer 1', first.body.id],
      ['system', 'Be brief.', second.body.id],
      ['user', [{ type: 'text', text: 'and then?' }], second.body.id],
      ['assistant', 'answer 2', second.body.id],
    ]);
    expect(page.body).toMatchObject({ object: 'list', has_more: false, next_cursor: null });
    expect(page.body.data[0].created_at).toEqual(expect.any(Number));
    expect((await t.call('GET', `/threads/${id}`)).body.status).toBe('idle');
  });

  it('messages are paged with the caps of the runs list, and the cursor reaches each message once', async () => {
    const t = await startTestServer();
    const id = (await t.call('POST', '/threads', {})).body.id as string;
    // Six runs: twelve messages, past the point where a sequence compared as text would sort 10 before 9.
    for (let i = 0; i < 6; i++) await t.call('POST', '/agents/echo/runs', { input: `m${i}`, thread_id: id });
    const texts: unknown[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const page: Body = (
        await t.call('GET', `/threads/${id}/messages?limit=5${cursor ? `&cursor=${cursor}` : ''}`)
      ).body;
      texts.push(...page.data.map((m: Body) => m.content));
      cursor = page.next_cursor;
      pages += 1;
    } while (cursor);
    expect(pages).toBe(3);
    const expected = Array.from({ length: 6 }, (_, i) => [`m${i}`, `done m${i}`]).flat();
    expect(texts).toEqual(expected);
    const all = (await t.call('GET', `/threads/${id}/messages?limit=5000`)).body.data as Body[];
    expect(all.map((m) => m.content)).toEqual(expected);
    for (const bad of ['limit=0', 'limit=-1', 'limit=abc', 'cursor=%00', 'cursor=bm9wZQ']) {
      const r = await t.call('GET', `/threads/${id}/messages?${bad}`);
      expect(r.status, bad).toBe(400);
      expect(r.body.error.param, bad).toBe(bad.split('=')[0]);
    }
  });

  it("a hostile tenant: another tenant's thread is 404 everywhere (read, messages, runs), as are made-up ids; a read token cannot create one", async () => {
    const t = await startTestServer();
    const id = (await t.call('POST', '/threads')).body.id as string;
    const other = await t.token({ tenant: 'other' });
    for (const [method, path, body] of [
      ['GET', `/threads/${id}`, undefined],
      ['GET', `/threads/${id}/messages`, undefined],
      ['POST', '/agents/echo/runs', { input: 'x', thread_id: id }],
      ['POST', '/agents/echo/runs', { input: 'x', thread_id: id, class: 'deferred' }],
    ] as const) {
      const r = await t.call(method, path, body, other);
      expect(r.status, `${method} ${path}`).toBe(404);
      expect(r.body.error.code).toBe('not_found');
    }
    for (const made of ['thr_000000000000000000000000', '__proto__', 'x'.repeat(100)]) {
      expect((await t.call('GET', `/threads/${made}`)).status).toBe(404);
      expect((await t.call('POST', '/agents/echo/runs', { input: 'x', thread_id: made })).status).toBe(404);
    }
    const reader = await t.token({ role: 'read' });
    expect((await t.call('POST', '/threads', {}, reader)).status).toBe(403);
    // Metadata keeps the bounds of run metadata, and `__proto__` is refused.
    const proto = await t.call('POST', '/threads', JSON.parse('{"metadata":{"__proto__":{"x":1}}}'));
    expect(proto.status).toBe(400);
    const wide = await t.call('POST', '/threads', {
      metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, i])),
    });
    expect(wide.status).toBe(400);
    expect(wide.body.error.param).toBe('metadata');
  });

  it('`input` and `messages` together, or neither, are a 400 naming the field', async () => {
    const t = await startTestServer();
    const both = await t.call('POST', '/agents/echo/runs', {
      input: 'a',
      messages: [{ role: 'user', content: 'b' }],
    });
    expect(both.status).toBe(400);
    expect(both.body.error.param).toBe('messages');
    const neither = await t.call('POST', '/agents/echo/runs', { metadata: {} });
    expect(neither.status).toBe(400);
    expect(neither.body.error.param).toBe('input');
    const badRole = await t.call('POST', '/agents/echo/runs', { messages: [{ role: 'tool', content: 'b' }] });
    expect(badRole.status).toBe(400);
    expect(badRole.body.error.param).toMatch(/^messages/);
  });
});
