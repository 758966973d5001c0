import { describe, expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../helpers.js';
import { gate } from '../process/harness.js';
import { openStream } from './sse.js';

const answer = 'The quick brown fox jumps over the lazy dog, and then it streams on for a while.';

describe('streamed runs', () => {
  it('answer Server-Sent Events in order: run.created, run.started, deltas that add up to the answer, run.completed; then the stream ends', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ text: answer }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider });
    const stream = await openStream(`${t.server.url}/api/client/v1/agents/echo/runs`, t.admin, {
      input: 'tell me',
      stream: true,
    });
    expect(stream.status).toBe(200);
    expect(stream.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const events = await stream.rest();
    const names = events.map((e) => e.event);
    expect(names[0]).toBe('run.created');
    expect(names[1]).toBe('run.started');
    expect(names.at(-1)).toBe('run.completed');
    const deltas = events.filter((e) => e.event === 'message.delta');
    // The stand-in sends the answer in 16-character pieces: several deltas, in order.
    expect(deltas.length).toBeGreaterThan(1);
    expect(names.slice(2, -1).every((n) => n === 'message.delta')).toBe(true);
    const id = events[0]!.data.id as string;
    expect(events[0]!.data).toMatchObject({ id, object: 'agent.run', status: 'running' });
    expect(deltas.every((d) => d.data.run_id === id)).toBe(true);
    expect(deltas.map((d) => d.data.text).join('')).toBe(answer);
    expect(events.at(-1)!.data).toMatchObject({ id, status: 'succeeded', output: { text: answer } });
    expect((await t.statusOf(id)).status).toBe('succeeded');
  });

  it('tool calls of the run show as tool.started / tool.completed with their call id and name, between the deltas', async () => {
    const provider = await startProviderStandIn({
      reply: toolThenAnswer(
        () => [{ name: 'lookup', arguments: { q: 'x' } }],
        (results) => `found ${results.join(',')}`,
      ),
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({
      provider,
      agents: (model) => ({
        researcher: createAgent({
          model,
          credentials: { apiKey: 'k' },
          tools: [
            tool<{ q: string }>({
              name: 'lookup',
              description: 'Look something up',
              parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
              execute: async ({ q }) => `result-${q}`,
            }),
          ],
        }),
      }),
    });
    const stream = await openStream(`${t.server.url}/api/client/v1/agents/researcher/runs`, t.admin, {
      input: 'look',
      stream: true,
    });
    const events = await stream.rest();
    const id = events[0]!.data.id as string;
    const tools = events.filter((e) => e.event.startsWith('tool.'));
    expect(tools.map((e) => e.event)).toEqual(['tool.started', 'tool.completed']);
    expect(tools[0]!.data).toEqual({ run_id: id, tool_call_id: expect.any(String), name: 'lookup' });
    expect(tools[1]!.data).toEqual(tools[0]!.data);
    const names = events.map((e) => e.event);
    expect(names.indexOf('tool.completed')).toBeLessThan(names.indexOf('message.delta'));
    expect(
      events
        .filter((e) => e.event === 'message.delta')
        .map((e) => e.data.text)
        .join(''),
    ).toBe('found result-x');
    expect(names.at(-1)).toBe('run.completed');
  });

  it('a quiet stream sends keep-alive comment lines (SLUICE_STREAM_KEEP_ALIVE_MS) until the answer comes', async () => {
    const release = gate();
    const provider = await startProviderStandIn({
      reply: async () => {
        await release.promise;
        return { text: 'late' };
      },
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider, settings: { streamKeepAliveMs: 200 } });
    const stream = await openStream(`${t.server.url}/api/client/v1/agents/echo/runs`, t.admin, {
      input: 'wait',
      stream: true,
    });
    expect((await stream.next())!.event).toBe('run.created');
    expect((await stream.next())!.event).toBe('run.started');
    const reading = stream.rest();
    await until(() => stream.comments >= 2, 'two keep-alive comments');
    release.open();
    const rest = await reading;
    expect(rest.map((e) => e.event)).toEqual(['message.delta', 'run.completed']);
  });

  it('a stream past runs.timeoutMs ends with run.failed, error.type timeout, and the provider request is aborted', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    // Long enough for the request to reach the provider on a loaded machine; the provider never answers.
    const t = await startTestServer({ provider, runs: { timeoutMs: 1_500 } });
    const stream = await openStream(`${t.server.url}/api/client/v1/agents/echo/runs`, t.admin, {
      input: 'slow',
      stream: true,
    });
    const events = await stream.rest();
    expect(events.map((e) => e.event)).toEqual(['run.created', 'run.started', 'run.failed']);
    expect(events[2]!.data).toMatchObject({ status: 'failed', error: { type: 'timeout' } });
    await until(() => provider.inFlight === 0, 'no provider request left open');
    expect(provider.requests.every((r) => r.aborted)).toBe(true);
  });

  it("a client that goes away: the run goes on by default, and is canceled (its provider request aborted) with on_disconnect: 'cancel'", async () => {
    let held = gate();
    const provider = await startProviderStandIn({
      reply: async (r) => {
        if (lastUserText(r).includes('stall')) return { stall: true };
        await held.promise;
        return { text: 'finished anyway' };
      },
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider });
    const url = `${t.server.url}/api/client/v1/agents/echo/runs`;

    const staying = await openStream(url, t.admin, { input: 'keep going', stream: true });
    const kept = (await staying.next())!.data.id as string;
    await until(() => provider.inFlight === 1, 'the first run at the provider');
    staying.close();
    held.open();
    await until(
      async () => (await t.statusOf(kept)).status === 'succeeded',
      'the run finishing without its client',
    );
    expect((await t.statusOf(kept)).output).toEqual({ text: 'finished anyway' });
    held = gate();

    const leaving = await openStream(url, t.admin, { input: 'stall', stream: true, on_disconnect: 'cancel' });
    const gone = (await leaving.next())!.data.id as string;
    await until(() => provider.inFlight === 1, 'the second run at the provider');
    leaving.close();
    await until(async () => (await t.statusOf(gone)).status === 'canceled', 'the run canceled');
    await until(() => provider.inFlight === 0, 'its provider request aborted');
    expect(provider.requests[1]).toMatchObject({ aborted: true, done: false });
  });

  it('a stream over a cap, or on a thread that stays busy, is answered with the plain JSON error before any event', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({
      provider,
      settings: { maxActivePerTenant: 1 },
      runs: { threadBusyWaitMs: 100 },
    });
    const url = `${t.server.url}/api/client/v1/agents/echo/runs`;
    const thread = (await t.call('POST', '/threads')).body.id as string;
    const first = await openStream(url, t.admin, { input: 'hold', stream: true, thread_id: thread });
    expect((await first.next())!.event).toBe('run.created');

    const capped = await openStream(url, t.admin, { input: 'x', stream: true });
    expect(capped.status).toBe(429);
    expect(capped.headers.get('content-type')).toMatch(/^application\/json/);
    expect(await capped.json()).toMatchObject({
      error: { code: 'agent_run_concurrency_limit', scope: 'tenant', limit_value: 1 },
    });
    const busy = await openStream(url, t.admin, { input: 'x', stream: true, thread_id: thread });
    expect(busy.status).toBe(409);
    expect(await busy.json()).toMatchObject({ error: { code: 'thread_busy', thread_id: thread } });
    for (const body of [
      { input: 'x', stream: true, class: 'deferred' },
      { input: 'x', stream: true, wait: false },
      { input: 'x', stream: true, delay_seconds: 5 },
    ]) {
      const refused = await t.call('POST', '/agents/echo/runs', body);
      expect(refused.status, JSON.stringify(body)).toBe(400);
      expect(refused.body.error.param).toBe('stream');
    }
    first.close();
  });
});
