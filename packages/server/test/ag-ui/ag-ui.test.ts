import { HttpAgent } from '@ag-ui/client';
import type { BaseEvent, Message } from '@ag-ui/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../helpers.js';
import { answerTo, startFileServer, type FileServer } from '../ws/harness.js';

let s: FileServer;
let token: string;
beforeAll(async () => {
  s = await startFileServer({ runs: { threadBusyWaitMs: 200 } });
  token = await s.token('agui');
});
afterAll(() => s.close());

const agentFor = (agent: string, threadId: string, messages: Message[]) =>
  new HttpAgent({
    url: `${s.url}/agents/${agent}/ag-ui`,
    headers: { Authorization: `Bearer ${token}` },
    threadId,
    initialMessages: messages,
  });

/** Runs an AG-UI agent with the real client and keeps every event it received, in order. */
async function run(agent: HttpAgent) {
  const events: BaseEvent[] = [];
  const result = await agent.runAgent(
    { runId: `run-${Math.random().toString(36).slice(2)}` },
    {
      onEvent: ({ event }) => void events.push(event),
    },
  );
  return { events, result };
}

const post = (agent: string, body: unknown) =>
  fetch(`${s.url}/agents/${agent}/ag-ui`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      accept: 'text/event-stream',
    },
    body: JSON.stringify(body),
  });

const user = (id: string, content: string): Message => ({ id, role: 'user', content });

describe('AG-UI runs', () => {
  it("the real HttpAgent runs an agent: RUN_STARTED first, the answer as one text message, RUN_FINISHED last; the agent's messages hold the answer", async () => {
    const agent = agentFor('echo', 'chat-1', [user('m1', 'hello there')]);
    const { events } = await run(agent);
    const types = events.map((e) => e.type);
    expect(types[0]).toBe('RUN_STARTED');
    expect(types.at(-1)).toBe('RUN_FINISHED');
    expect(types[1]).toBe('TEXT_MESSAGE_START');
    expect(types.at(-2)).toBe('TEXT_MESSAGE_END');
    const deltas = events.filter((e) => e.type === 'TEXT_MESSAGE_CONTENT') as unknown as { delta: string }[];
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.map((d) => d.delta).join('')).toBe(answerTo('hello there'));
    expect(events[0]).toMatchObject({ threadId: 'chat-1' });
    const last = agent.messages.at(-1)!;
    expect(last).toMatchObject({ role: 'assistant', content: answerTo('hello there') });

    // The same AG-UI thread again: the client resends everything, the run reads the thread.
    agent.addMessage(user('m3', 'and then?'));
    await run(agent);
    expect(s.asked.at(-1)!.map((m) => m.role)).toEqual(['user', 'assistant', 'user']);
  });

  it('server tool calls arrive as TOOL_CALL_START / _ARGS / _END / _RESULT between text messages', async () => {
    const { events } = await run(agentFor('researcher', 'chat-tools', [user('m1', 'look it up')]));
    const types = events.map((e) => String(e.type));
    expect(types.filter((t) => t.startsWith('TOOL_CALL'))).toEqual([
      'TOOL_CALL_START',
      'TOOL_CALL_ARGS',
      'TOOL_CALL_END',
      'TOOL_CALL_RESULT',
    ]);
    const args = events.find((e) => e.type === 'TOOL_CALL_ARGS') as unknown as { delta: string };
    expect(JSON.parse(args.delta)).toEqual({ q: 'x' });
    expect(events.find((e) => e.type === 'TOOL_CALL_RESULT')).toMatchObject({
      content: 'result-x',
      role: 'tool',
    });
    const start = events.find((e) => e.type === 'TOOL_CALL_START') as unknown as {
      toolCallId: string;
      toolCallName: string;
    };
    expect(start.toolCallName).toBe('lookup');
    expect(events.find((e) => e.type === 'TOOL_CALL_END')).toMatchObject({ toolCallId: start.toolCallId });
    expect(types.indexOf('TOOL_CALL_END')).toBeLessThan(types.indexOf('TEXT_MESSAGE_START'));
    const text = (events.filter((e) => e.type === 'TEXT_MESSAGE_CONTENT') as unknown as { delta: string }[])
      .map((d) => d.delta)
      .join('');
    expect(text).toBe('found result-x');
  });

  it('a failing agent ends with RUN_ERROR after RUN_STARTED', async () => {
    const events: BaseEvent[] = [];
    await agentFor('echo', 'chat-fail', [user('m1', 'please fail')])
      .runAgent(
        {},
        {
          onEvent: ({ event }) => void events.push(event),
        },
      )
      .catch(() => undefined);
    expect(events[0]!.type).toBe('RUN_STARTED');
    expect(events.at(-1)).toMatchObject({ type: 'RUN_ERROR', code: 'agent_error' });
  });

  it('a history of 10,000 messages is accepted; a trailing turn of 501 messages is 413 limit messages; 10,001 in all is 413 too', async () => {
    const history: Message[] = [];
    for (let i = 0; i < 9_999; i++)
      history.push(
        i % 2 === 0
          ? user(`h${i}`, `question ${i}`)
          : { id: `h${i}`, role: 'assistant', content: `answer ${i}` },
      );
    history.push({ id: 'last-a', role: 'assistant', content: 'ok' });
    const accepted = await post('echo', {
      threadId: 'chat-long',
      runId: 'r1',
      messages: [...history.slice(1), user('now', 'the question')],
      tools: [],
      context: [],
      state: {},
      forwardedProps: {},
    });
    expect(accepted.status).toBe(200);
    expect(await accepted.text()).toMatch(/"type":"RUN_FINISHED"/);

    const turn = Array.from({ length: 501 }, (_, i) => user(`t${i}`, 'x'));
    const refused = await post('echo', {
      threadId: 'chat-turn',
      runId: 'r2',
      messages: [...history.slice(0, 100), ...turn],
      tools: [],
      context: [],
    });
    expect(refused.status).toBe(413);
    expect(((await refused.json()) as { error: object }).error).toMatchObject({
      type: 'request_too_large',
      limit: 'messages',
      limit_value: 500,
      value: 501,
    });
    const tooLong = await post('echo', {
      threadId: 'chat-all',
      runId: 'r3',
      messages: [...history, user('x', 'x'), user('y', 'y')],
      tools: [],
      context: [],
    });
    expect(tooLong.status).toBe(413);
    expect(((await tooLong.json()) as { error: object }).error).toMatchObject({
      limit: 'messages',
      limit_value: 10_000,
    });
  });

  it('threadId takes the thread lock: a second run on a busy AG-UI thread is a plain 409 thread_busy before any stream', async () => {
    const first = run(agentFor('echo', 'chat-busy', [user('m1', 'hold:agui')]));
    await until(() => s.asked.some((c) => c.some((m) => m.text.includes('hold:agui'))), 'the first run');
    const second = await post('echo', {
      threadId: 'chat-busy',
      runId: 'r2',
      messages: [user('m2', 'me too')],
      tools: [],
      context: [],
    });
    expect(second.status).toBe(409);
    expect(second.headers.get('content-type')).toMatch(/application\/json/);
    expect(((await second.json()) as { error: object }).error).toMatchObject({
      type: 'thread_busy',
      code: 'thread_busy',
    });
    s.release('agui');
    expect((await first).events.at(-1)!.type).toBe('RUN_FINISHED');
  });

  it('a body that is not a RunAgentInput is refused by its schema, naming the field', async () => {
    const r = await post('echo', {
      threadId: 'x',
      runId: 'y',
      messages: [{ id: 'm', role: 'wizard', content: 'hi' }],
    });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: object }).error).toMatchObject({
      type: 'invalid_request',
      param: 'messages.0.role',
    });
    const proto = await fetch(`${s.url}/agents/echo/ag-ui`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: '{"threadId":"x","runId":"y","messages":[],"__proto__":{"a":1}}',
    });
    expect(proto.status).toBe(400);
  });
});
