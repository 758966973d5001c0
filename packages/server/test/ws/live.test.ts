import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../helpers.js';
import { Client, answerTo, refusedUpgrade, startFileServer, type FileServer, type Frame } from './harness.js';

/**
 * Live sessions over real sockets (`ws`), the server on PGlite, the provider stand-in streaming
 * each answer in several deltas ("hold:KEY" waits for `release(KEY)`, "stall" never answers).
 */

let s: FileServer;
beforeAll(async () => {
  s = await startFileServer({
    runs: { threadBusyWaitMs: 200 },
    websocket: { maxConnectionsPerUser: 2 },
  });
});
afterAll(() => s.close());

const liveUrl = (server: FileServer, agent: string, thread: string) =>
  `${server.wsUrl.replace(/\/ws$/, '/live')}?agent=${encodeURIComponent(agent)}&thread_id=${encodeURIComponent(thread)}`;

async function session(user: string, server = s): Promise<{ c: Client; token: string; thread: string }> {
  const token = await server.token(user);
  const thread = (await server.call('POST', '/threads', {}, token)).body.id as string;
  return { c: await Client.open(liveUrl(server, 'echo', thread), token), token, thread };
}

/** The run holding a thread, once one holds it (the thread API says only that it is busy). */
async function holderOf(thread: string): Promise<string | undefined> {
  const rows = (
    await s.server.store.db.query<{ id: string }>(
      `SELECT r.id FROM threads t JOIN agent_runs r ON r.id = t.active_run_id
       WHERE t.id = $1::text AND r.status = 'running'`,
      [thread],
    )
  ).rows;
  return rows[0]?.id;
}

/** The frames from the `n`-th final frame (0-based) back to the one before, and that final one. */
function turnFrames(c: Client, n: number): Frame[] {
  const out: Frame[] = [];
  let seen = 0;
  for (const f of c.frames) {
    if (f.type === 'error') continue;
    if (seen === n) out.push(f);
    if (f.type === 'turn.completed' || f.type === 'turn.failed') seen++;
  }
  return out;
}

const finalCount = (c: Client) =>
  c.frames.filter((f) => f.type === 'turn.completed' || f.type === 'turn.failed').length;
const nthFinal = (c: Client, n: number) => c.until(() => finalCount(c) > n, `turn ${n + 1}'s end`);

describe('live sessions', () => {
  it('each input is a turn of the thread: deltas that add up to the answer, then turn.completed; the next turn sees the first', async () => {
    const { c, token, thread } = await session('talk');
    c.send({ type: 'input', text: 'first question' });
    await nthFinal(c, 0);
    const first = turnFrames(c, 0);
    expect(first.slice(0, -1).every((f) => f.type === 'message.delta')).toBe(true);
    expect(first.length).toBeGreaterThan(2);
    const done = first.at(-1)!;
    expect(done.type).toBe('turn.completed');
    expect(done.data.text).toBe(answerTo('first question'));
    expect(
      first
        .slice(0, -1)
        .map((f) => f.data.text)
        .join(''),
    ).toBe(done.data.text);
    const run = await s.call('GET', `/agents/runs/${done.data.run_id}`, undefined, token);
    expect(run.body).toMatchObject({ status: 'succeeded', thread_id: thread });

    c.send({ type: 'input', text: 'second question' });
    await nthFinal(c, 1);
    expect(turnFrames(c, 1).at(-1)!.data.text).toBe(answerTo('second question'));
    // The second turn was asked with the thread's history: the first question and its answer.
    const texts = s.asked.at(-1)!.map((m) => m.text);
    expect(texts).toEqual(
      expect.arrayContaining(['first question', answerTo('first question'), 'second question']),
    );
    await c.close();
  });

  it('a turn holds the thread: an HTTP run on it meanwhile is 409 thread_busy; an input during the turn is an error frame, the socket stays open', async () => {
    const { c, token, thread } = await session('busy');
    c.send({ type: 'input', text: 'hold:busy now' });
    let active: string | undefined;
    await until(async () => {
      active = await holderOf(thread);
      return active !== undefined;
    }, 'the turn holds its thread');
    const http = await s.call('POST', '/agents/echo/runs', { input: 'x', thread_id: thread }, token);
    expect(http.status).toBe(409);
    expect(http.body.error).toMatchObject({ type: 'thread_busy', active_run_id: active });

    c.send({ type: 'input', text: 'too soon' });
    const refused = await c.until((f) => f.type === 'error');
    expect(refused.error).toMatchObject({ code: 'turn_in_progress', param: 'on_busy' });
    s.release('busy');
    await nthFinal(c, 0);
    expect(turnFrames(c, 0).at(-1)).toMatchObject({ type: 'turn.completed', data: { run_id: active } });
    expect(finalCount(c)).toBe(1);
    await c.close();
  });

  it('on_busy: cancel stops the turn in progress (turn.failed, run canceled) and runs the new input after it', async () => {
    const { c, token } = await session('replace');
    c.send({ type: 'input', text: 'hold:never long answer' });
    await until(() => s.provider.inFlight > 0, 'the first turn asks the provider');
    c.send({ type: 'input', text: 'instead this', on_busy: 'cancel' });
    await nthFinal(c, 1);
    const failed = turnFrames(c, 0).at(-1)!;
    expect(failed.type).toBe('turn.failed');
    const run = await s.call('GET', `/agents/runs/${failed.data.run_id}`, undefined, token);
    expect(run.body.status).toBe('canceled');
    expect(turnFrames(c, 1).at(-1)).toMatchObject({
      type: 'turn.completed',
      data: { text: answerTo('instead this') },
    });
    await c.close();
  });

  it('bad frames get an error frame naming the field, and the socket stays open for the next turn', async () => {
    const { c } = await session('garbage');
    const bad: [unknown, string | null][] = [
      ['not json {', null],
      [{ type: 'run', text: 'x' }, 'type'],
      [{ type: 'input' }, 'text'],
      [{ type: 'input', text: '' }, 'text'],
      [{ type: 'input', text: '   ' }, 'text'],
      [{ type: 'input', text: 'x', on_busy: 'later' }, 'on_busy'],
      ['{"type":"input","text":"x","__proto__":{"admin":true}}', '__proto__'],
    ];
    for (const [frame, field] of bad) {
      const before = c.frames.length;
      c.send(frame);
      const answer = await c.until((f) => c.frames.indexOf(f) >= before && f.type === 'error');
      expect(answer.error.type).toBe('invalid_request');
      if (field) expect(`${answer.error.param} ${answer.error.message}`).toContain(field);
    }
    expect(finalCount(c)).toBe(0);
    c.send({ type: 'input', text: 'still here' });
    await nthFinal(c, 0);
    expect(turnFrames(c, 0).at(-1)).toMatchObject({ type: 'turn.completed' });
    await c.close();
  });

  it('a frame over 1 MiB closes the socket with 1009', async () => {
    const { c } = await session('big');
    c.send({ type: 'input', text: 'x'.repeat(1024 * 1024) });
    expect((await c.closed).code).toBe(1009);
  });

  it('the client leaving mid-turn cancels the turn and frees the thread for the next session', async () => {
    const { c, token, thread } = await session('leaver');
    c.send({ type: 'input', text: 'hold:gone forever' });
    let active: string | undefined;
    await until(async () => {
      active = await holderOf(thread);
      return active !== undefined;
    }, 'the turn holds its thread');
    await c.close();
    await until(
      async () =>
        (await s.call('GET', `/agents/runs/${active}`, undefined, token)).body.status === 'canceled',
      'the turn canceled',
    );
    await until(
      async () => (await s.call('GET', `/threads/${thread}`, undefined, token)).body.status === 'idle',
      'the thread freed',
    );
    const next = await Client.open(liveUrl(s, 'echo', thread), token);
    next.send({ type: 'input', text: 'back again' });
    await nthFinal(next, 0);
    expect(turnFrames(next, 0).at(-1)!.type).toBe('turn.completed');
    await next.close();
  });

  it('refused before the upgrade, as /ws: no token 401, unknown agent 404, another tenant’s thread 404, no thread_id 400, a plain GET 426', async () => {
    const token = await s.token('refused');
    const thread = (await s.call('POST', '/threads', {}, token)).body.id as string;
    const auth = { authorization: `Bearer ${token}` };
    expect((await refusedUpgrade(liveUrl(s, 'echo', thread))).status).toBe(401);
    const agent = await refusedUpgrade(liveUrl(s, 'nobody', thread), auth);
    expect(agent.status).toBe(404);
    expect(agent.body.error.message).toContain('nobody');
    await s.server.store.db.query(
      `INSERT INTO threads (id, tenant, project, user_id) VALUES ('thr_other_tenant_live', 'other', 'p', 'u')`,
    );
    const other = await refusedUpgrade(liveUrl(s, 'echo', 'thr_other_tenant_live'), auth);
    expect(other.status).toBe(404);
    const noThread = await refusedUpgrade(s.wsUrl.replace(/\/ws$/, '/live?agent=echo'), auth);
    expect(noThread.status).toBe(400);
    expect(JSON.stringify(noThread.body.error)).toContain('thread_id');
    const plain = await fetch(liveUrl(s, 'echo', thread).replace(/^ws/, 'http'), { headers: auth });
    expect(plain.status).toBe(426);
  });

  it('a session counts under the WebSocket connection caps', async () => {
    const token = await s.token('capped');
    const thread = (await s.call('POST', '/threads', {}, token)).body.id as string;
    const ws = await Client.open(s.wsUrl, token);
    const live = await Client.open(liveUrl(s, 'echo', thread), token);
    const third = await refusedUpgrade(liveUrl(s, 'echo', thread), { authorization: `Bearer ${token}` });
    expect(third.status).toBe(429);
    expect(third.body.error).toMatchObject({
      code: 'websocket_connection_limit',
      scope: 'user',
      limit_value: 2,
    });
    await Promise.all([ws.close(), live.close()]);
  });
});

describe('a live session and runs.timeoutMs', () => {
  it('a turn past the timeout fails; the session goes on past it and the next turn completes', async () => {
    const short = await startFileServer({ runs: { timeoutMs: 300 } });
    try {
      const { c } = await session('slow', short);
      c.send({ type: 'input', text: 'stall' });
      await nthFinal(c, 0);
      const failed = turnFrames(c, 0).at(-1)!;
      expect(failed.type).toBe('turn.failed');
      expect(failed.data.error.type).toBe('timeout');
      c.send({ type: 'input', text: 'quick one' });
      await nthFinal(c, 1);
      expect(turnFrames(c, 1).at(-1)).toMatchObject({
        type: 'turn.completed',
        data: { text: answerTo('quick one') },
      });
      await c.close();
    } finally {
      await short.close();
    }
  });
});
