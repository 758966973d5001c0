import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until, type Body } from '../helpers.js';
import { createToken, revokeToken } from '@sluice/server';
import { Client, answerTo, startFileServer, type FileServer } from './harness.js';

let s: FileServer;
beforeAll(async () => {
  s = await startFileServer({ runs: { maxConcurrentPerUser: 2, threadBusyWaitMs: 200 } });
});
afterAll(() => s.close());

const open = async (user: string, how: 'header' | 'query' = 'header') => {
  const client = await Client.open(s.wsUrl, await s.token(user), how);
  return client;
};
const call = (token: string, method: string, path: string, body?: unknown) =>
  s.call(method, path, body, token);
const finals = ['run.completed', 'run.failed', 'run.canceled'];

describe('WebSocket runs', () => {
  it('a run frame streams run.created, run.started, deltas that add up to the answer, then run.completed, all under its request_id', async () => {
    const c = await open('stream');
    c.send({ type: 'run', request_id: 'r1', agent: 'echo', input: 'tell me' });
    const frames = await c.request('r1');
    const types = frames.map((f) => f.type);
    expect(types.slice(0, 2)).toEqual(['run.created', 'run.started']);
    expect(types.at(-1)).toBe('run.completed');
    const deltas = frames.filter((f) => f.type === 'message.delta');
    expect(deltas.length).toBeGreaterThan(1);
    expect(types.slice(2, -1).every((t) => t === 'message.delta')).toBe(true);
    const id = frames[0]!.data.id as string;
    expect(deltas.every((d) => d.data.run_id === id)).toBe(true);
    expect(deltas.map((d) => d.data.text).join('')).toBe(answerTo('tell me'));
    expect(frames.at(-1)!.data).toMatchObject({
      id,
      status: 'succeeded',
      output: { text: answerTo('tell me') },
    });
    await c.close();
  });

  it('two runs on one socket (token in the query) go at once, each frame under its own request_id; tool calls show as tool.started / tool.completed', async () => {
    const c = await open('two', 'query');
    c.send({ type: 'run', request_id: 'a', agent: 'echo', input: 'hold:two first' });
    c.send({
      type: 'run',
      request_id: 'b',
      agent: 'researcher',
      messages: [{ role: 'user', content: 'look' }],
    });
    const b = await c.request('b');
    // b ended while a is still held at the provider: the two were in flight together.
    expect(c.frames.filter((f) => f.request_id === 'a').map((f) => f.type)).toEqual([
      'run.created',
      'run.started',
    ]);
    expect(b.map((f) => f.type).filter((t) => t.startsWith('tool.'))).toEqual([
      'tool.started',
      'tool.completed',
    ]);
    expect(b.find((f) => f.type === 'tool.started')!.data).toEqual({
      run_id: b[0]!.data.id,
      tool_call_id: expect.any(String),
      name: 'lookup',
    });
    expect(
      b
        .filter((f) => f.type === 'message.delta')
        .map((f) => f.data.text)
        .join(''),
    ).toBe('found result-x');
    s.release('two');
    const a = await c.request('a');
    expect(a.at(-1)).toMatchObject({ type: 'run.completed', data: { status: 'succeeded' } });
    expect(a[0]!.data.id).not.toBe(b[0]!.data.id);
    await c.close();
  });

  it('a cancel frame stops a run of the socket: it ends with run.canceled', async () => {
    const c = await open('cancel');
    c.send({ type: 'run', request_id: 'x', agent: 'echo', input: 'stall' });
    const started = await c.until((f) => f.request_id === 'x' && f.type === 'run.started');
    await until(() => s.provider.inFlight > 0, 'the run at the provider');
    c.send({ type: 'cancel', run_id: started.data.id, request_id: 'stop-x' });
    const frames = await c.request('x');
    expect(frames.at(-1)).toMatchObject({
      type: 'run.canceled',
      data: { id: started.data.id, status: 'canceled' },
    });
    expect(c.frames.some((f) => f.request_id === 'stop-x')).toBe(false);
    // A cancel of a run that does not exist is refused under its own request id.
    c.send({ type: 'cancel', run_id: 'run_nope', request_id: 'stop-nope' });
    expect((await c.until((f) => f.request_id === 'stop-nope')).error).toMatchObject({
      type: 'not_found',
      code: 'not_found',
    });
    await c.close();
  });

  it('refused frames answer an error frame with the HTTP error body, and the socket stays usable', async () => {
    const c = await open('refused');
    const refusal = async (frame: unknown, requestId: string | null) => {
      const before = c.frames.length;
      c.send(frame);
      await c.until((f) => c.frames.indexOf(f) >= before && f.type === 'error', 'an error frame');
      const got = c.frames.slice(before).find((f) => f.type === 'error')!;
      expect(got.request_id).toBe(requestId);
      expect(got.error.code).toBe(got.error.type);
      return got.error as Body;
    };
    expect(await refusal({ type: 'run', request_id: 'u', agent: 'nobody', input: 'hi' }, 'u')).toMatchObject({
      type: 'not_found',
      message: 'No agent `nobody`',
    });
    expect(await refusal({ type: 'run', request_id: 'm', input: 'hi' }, 'm')).toMatchObject({
      type: 'invalid_request',
      param: 'agent',
      message: 'Expected `agent` in the frame',
    });
    expect(
      await refusal({ type: 'run', request_id: 'k', agent: 'echo', input: 'hi', wait: false }, 'k'),
    ).toMatchObject({
      type: 'invalid_request',
      param: 'wait',
    });
    expect(await refusal({ type: 'launch' }, null)).toMatchObject({ type: 'invalid_request', param: 'type' });
    expect(await refusal('{"type": "run", ', null)).toMatchObject({
      type: 'invalid_request',
      message: expect.stringMatching(/^The frame is not valid JSON/),
    });
    expect(
      await refusal(
        '{"type":"run","request_id":"p","agent":"echo","input":"hi","__proto__":{"admin":true}}',
        null,
      ),
    ).toMatchObject({ type: 'invalid_request', param: '__proto__' });
    expect(
      await refusal(
        '{"type":"run","request_id":"q","agent":"echo","config":{"constructor":{"prototype":{}}},"input":"hi"}',
        null,
      ),
    ).toMatchObject({ type: 'invalid_request', param: '__proto__' });
    expect(({} as Record<string, unknown>).admin).toBeUndefined();
    expect(
      await refusal(
        {
          type: 'run',
          request_id: 'e',
          agent: 'echo',
          input: 'hi',
          thread_id: 'thr_000000000000000000000000',
        },
        'e',
      ),
    ).toMatchObject({ type: 'not_found' });
    const many = Array.from({ length: 501 }, () => ({ role: 'user', content: 'x' }));
    expect(
      await refusal({ type: 'run', request_id: 'big', agent: 'echo', messages: many }, 'big'),
    ).toMatchObject({
      type: 'request_too_large',
      limit: 'messages',
      limit_value: 500,
      value: 501,
    });
    const blocks = Array.from({ length: 101 }, () => ({ type: 'text', text: 'x' }));
    expect(
      await refusal(
        { type: 'run', request_id: 'blk', agent: 'echo', messages: [{ role: 'user', content: blocks }] },
        'blk',
      ),
    ).toMatchObject({
      type: 'request_too_large',
      limit: 'content_blocks',
    });
    expect(
      await refusal({ type: 'run', request_id: 'chr', agent: 'echo', input: 'x'.repeat(1_000_001) }, 'chr'),
    ).toMatchObject({
      type: 'request_too_large',
      limit: 'text_chars',
      limit_value: 1_000_000,
    });
    const before = c.frames.length;
    c.ws.send(Buffer.from('{"type":"cancel","run_id":"x"}'), { binary: true });
    await c.until((f) => c.frames.indexOf(f) >= before && f.type === 'error', 'an error frame');
    // The same socket still runs.
    c.send({ type: 'run', request_id: 'ok', agent: 'echo', input: 'still here' });
    expect((await c.request('ok')).at(-1)!.type).toBe('run.completed');
    await c.close();

    const reader = await Client.open(s.wsUrl, await s.token('reader', 'read'));
    reader.send({ type: 'run', request_id: 'r', agent: 'echo', input: 'hi' });
    expect((await reader.until((f) => f.request_id === 'r')).error).toMatchObject({
      type: 'permission_denied',
    });
    await reader.close();
  });

  it('held WebSocket runs count for the per-user cap of held runs: over it a run frame and an HTTP run both get 429 scope user', async () => {
    const token = await s.token('capped');
    const c = await Client.open(s.wsUrl, token);
    c.send({ type: 'run', request_id: '1', agent: 'echo', input: 'hold:cap one' });
    c.send({ type: 'run', request_id: '2', agent: 'echo', input: 'hold:cap two' });
    await c.until((f) => f.request_id === '1' && f.type === 'run.started');
    await c.until((f) => f.request_id === '2' && f.type === 'run.started');
    c.send({ type: 'run', request_id: '3', agent: 'echo', input: 'three' });
    expect((await c.until((f) => f.request_id === '3')).error).toMatchObject({
      type: 'agent_run_concurrency_limit',
      scope: 'user',
      limit: 'max_concurrent_per_user',
      limit_value: 2,
      active: 2,
    });
    const http = await call(token, 'POST', '/agents/echo/runs', { input: 'over http', stream: true });
    expect(http.status).toBe(429);
    expect(http.body.error).toMatchObject({ type: 'agent_run_concurrency_limit', scope: 'user' });
    s.release('cap');
    await c.request('1');
    await c.request('2');
    // Their places are given back as they end.
    c.send({ type: 'run', request_id: '4', agent: 'echo', input: 'four' });
    expect((await c.request('4')).at(-1)!.type).toBe('run.completed');
    await c.close();
  });

  it('a WebSocket run takes its thread: an HTTP run on it gets 409 thread_busy naming the WebSocket run', async () => {
    const token = await s.token('threads');
    const thread = (await call(token, 'POST', '/threads', {})).body.id as string;
    const c = await Client.open(s.wsUrl, token);
    c.send({ type: 'run', request_id: 't1', agent: 'echo', input: 'hold:thread first', thread_id: thread });
    const started = await c.until((f) => f.request_id === 't1' && f.type === 'run.started');
    expect(started.data.thread_id).toBe(thread);
    const busy = await call(token, 'POST', '/agents/echo/runs', { input: 'second', thread_id: thread });
    expect(busy.status).toBe(409);
    expect(busy.body.error).toMatchObject({
      type: 'thread_busy',
      thread_id: thread,
      active_run_id: started.data.id,
    });
    // And a second frame on the same thread waits for it, then gets the same 409 as an error frame.
    c.send({ type: 'run', request_id: 't2', agent: 'echo', input: 'again', thread_id: thread });
    expect((await c.until((f) => f.request_id === 't2')).error).toMatchObject({
      type: 'thread_busy',
      active_run_id: started.data.id,
    });
    s.release('thread');
    expect((await c.request('t1')).at(-1)!.type).toBe('run.completed');
    // The thread kept the run's turn: the next run continues it.
    c.send({ type: 'run', request_id: 't3', agent: 'echo', input: 'third', thread_id: thread });
    expect((await c.request('t3')).at(-1)!.type).toBe('run.completed');
    const messages = (await call(token, 'GET', `/threads/${thread}/messages`)).body.data as {
      role: string;
    }[];
    expect(messages.map((m) => m.role)).toEqual(['user', 'assistant', 'user', 'assistant']);
    await c.close();
  });

  it('a token revoked while its socket is open runs nothing more: the next run frame gets 401 and the socket closes with 1008', async () => {
    const { id, secret } = await createToken(s.server.store.db, {
      tenant: 't',
      project: 'p',
      user: 'revoked',
      role: 'member',
    });
    const c = await Client.open(s.wsUrl, secret);
    c.send({ type: 'run', request_id: 'before', agent: 'echo', input: 'still live' });
    expect((await c.request('before')).at(-1)!.type).toBe('run.completed');
    expect(await revokeToken(s.server.store.db, id)).toBe(true);
    c.send({ type: 'run', request_id: 'after', agent: 'echo', input: 'after revocation' });
    const after = await c.request('after').catch(() => c.frames.filter((f) => f.request_id === 'after'));
    expect(after.map((f) => f.type)).toEqual(['error']);
    expect(after[0]!.error).toMatchObject({ type: 'authentication_required' });
    expect(await c.closed).toMatchObject({ code: 1008 });
    expect(s.asked.some((m) => m.some((x) => x.text.includes('after revocation')))).toBe(false);
  });

  it('a flood of cancel frames is bounded per socket like run frames: past 100 in flight they get 429 (not unbounded lookups), every frame is answered', async () => {
    const c = await open('cancel-flood');
    const frames = Array.from({ length: 300 }, (_, i) =>
      JSON.stringify({ type: 'cancel', run_id: 'run_nosuch', request_id: `c${i}` }),
    );
    // Sent in one tick: the frames reach the server together, before any of their lookups can end.
    for (const f of frames) c.ws.send(f);
    await c.until((f) => f.request_id === 'c299', 'the answer to the last cancel');
    await c.until(() => c.frames.filter((f) => f.request_id?.startsWith('c')).length === 300, 'all answers');
    const kinds = c.frames.filter((f) => f.request_id?.startsWith('c')).map((f) => f.error?.type as string);
    expect(kinds.filter((k) => k === 'too_many_requests').length).toBeGreaterThan(0);
    expect(kinds.every((k) => k === 'too_many_requests' || k === 'not_found')).toBe(true);
    await c.close();
  });

  it('a socket that closes leaves its runs going, unless the run frame said on_disconnect: cancel', async () => {
    const token = await s.token('leaver');
    const c = await Client.open(s.wsUrl, token);
    c.send({ type: 'run', request_id: 'stay', agent: 'echo', input: 'hold:leave stays' });
    c.send({ type: 'run', request_id: 'go', agent: 'echo', input: 'stall', on_disconnect: 'cancel' });
    const stay = (await c.until((f) => f.request_id === 'stay' && f.type === 'run.started')).data
      .id as string;
    const go = (await c.until((f) => f.request_id === 'go' && f.type === 'run.started')).data.id as string;
    await c.close();
    await until(
      async () => (await call(token, 'GET', `/agents/runs/${go}`)).body.status === 'canceled',
      'the canceled run',
    );
    expect((await call(token, 'GET', `/agents/runs/${stay}`)).body.status).toBe('running');
    s.release('leave');
    await until(
      async () => (await call(token, 'GET', `/agents/runs/${stay}`)).body.status === 'succeeded',
      'the run that stays',
    );
    expect(finals).toContain('run.completed');
  });
});
