import { describe, expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';
import { RateLimitError, SluiceError, createClient, type StreamEvent } from '@sluice/client';
import { describeWith } from '../../../scripts/service-suites.js';
import { afterThisTest, freshDatabase, postgres, startTestServer, until } from '../../server/test/helpers.js';
import { gate, startWorker, testDatabase } from '../../server/test/process/harness.js';
import { startSwitchProxy } from './switch-proxy.js';

describe('@sluice/client against the run server', () => {
  it('every call: runs create/get/list/cancel/wait/stream, threads create/get/messages (page by page), queue', async () => {
    const t = await startTestServer();
    const sluice = createClient({ baseUrl: t.server.url, token: t.admin });

    const inline = await sluice.runs.create('echo', { input: 'hello' });
    expect(inline).toMatchObject({
      object: 'agent.run',
      status: 'succeeded',
      output: { text: 'done hello' },
    });
    expect(await sluice.runs.get(inline.id)).toMatchObject({ id: inline.id, status: 'succeeded' });

    const queued = await sluice.runs.create('echo', { input: 'later', wait: false });
    expect(queued.status).toBe('queued');
    expect(await sluice.runs.wait(queued.id)).toMatchObject({ id: queued.id, status: 'succeeded' });

    const stalled = await sluice.runs.create('echo', { input: 'stall', wait: false });
    await until(
      async () => (await sluice.runs.get(stalled.id)).status === 'running',
      'the stalled run running',
    );
    const waiting = sluice.runs.wait(stalled.id);
    const canceled = await sluice.runs.cancel(stalled.id);
    expect(canceled.id).toBe(stalled.id);
    expect((await waiting).status).toBe('canceled');

    const page = await sluice.runs.list({ limit: '2' });
    expect(page.data.map((r) => r.id)).toEqual([inline.id, queued.id]);
    expect(page.next_cursor).not.toBeNull();
    const rest = await sluice.runs.list({ limit: '2', cursor: page.next_cursor! });
    expect(rest.data.map((r) => r.id)).toEqual([stalled.id]);

    const events: StreamEvent[] = [];
    for await (const e of sluice.runs.stream('echo', { input: 'streamed' })) events.push(e);
    expect(events.map((e) => e.id)).toEqual(events.map((_, i) => i + 1));
    expect(events[0]!.event).toBe('run.created');
    expect(events.at(-1)).toMatchObject({ event: 'run.completed', data: { status: 'succeeded' } });
    const text = events.flatMap((e) => (e.event === 'message.delta' ? [e.data.text] : [])).join('');
    expect(text).toBe('done streamed');

    const thread = await sluice.threads.create({ metadata: { who: 'test' } });
    expect(await sluice.threads.get(thread.id)).toMatchObject({ id: thread.id, status: 'idle' });
    for (const input of ['one', 'two', 'three'])
      await sluice.runs.create('echo', { input, thread_id: thread.id });
    const messages = [];
    for await (const m of sluice.threads.messages(thread.id, { limit: 2 })) messages.push(m);
    expect(messages.map((m) => [m.role, m.content])).toEqual([
      ['user', 'one'],
      ['assistant', 'done one'],
      ['user', 'two'],
      ['assistant', 'done two'],
      ['user', 'three'],
      ['assistant', 'done three'],
    ]);

    expect(await sluice.queue()).toMatchObject({ object: 'agent.run_queue', default: { running: 0 } });
  });

  it('errors: a bad body names its field; a 429 is a RateLimitError with retryAfterMs, retried after it with maxRetries; an AbortSignal stops a call', async () => {
    const t = await startTestServer({ settings: { maxActivePerTenant: 1 } });
    const sluice = createClient({ baseUrl: t.server.url, token: t.admin, maxRetries: 0 });
    const bad = await sluice.runs
      .create('echo', { input: 'x', on_busy: 'sometimes' as 'wait' })
      .catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(SluiceError);
    expect(bad).toMatchObject({ status: 400, param: 'on_busy' });

    const held = await sluice.runs.create('echo', { input: 'stall', wait: false });
    const refused = await sluice.runs.create('echo', { input: 'x', wait: false }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(RateLimitError);
    expect(refused).toMatchObject({ status: 429, type: 'agent_run_concurrency_limit' });
    expect((refused as RateLimitError).retryAfterMs).toBeGreaterThan(0);

    // With a retry: the refusal frees the cap (the held run is canceled), and its Retry-After is
    // shortened to 1 ms, so the second attempt is admitted.
    let calls = 0;
    const retrying = createClient({
      baseUrl: t.server.url,
      token: t.admin,
      maxRetries: 1,
      fetch: async (input, init) => {
        calls++;
        const response = await fetch(input, init);
        if (response.status !== 429) return response;
        await sluice.runs.cancel(held.id);
        const body = (await response.json()) as { error: Record<string, unknown> };
        return new Response(JSON.stringify({ error: { ...body.error, retry_after_ms: 1 } }), {
          status: 429,
          headers: response.headers,
        });
      },
    });
    const admitted = await retrying.runs.create('echo', { input: 'second', wait: false });
    expect(calls).toBe(2);
    expect(admitted.object).toBe('agent.run');

    const aborted = await sluice.runs
      .get(held.id, { signal: AbortSignal.abort(new Error('stop')) })
      .catch((e: unknown) => e);
    expect(aborted).toMatchObject({ message: 'stop' });
    expect(await sluice.runs.get('run_000000000000000000000000').catch((e: unknown) => e)).toMatchObject({
      status: 404,
    });
  });
});

describeWith({ PostgreSQL: postgres })('@sluice/client across two server processes', () => {
  it('a stream cut mid-run by the proxy resumes on the other server with Last-Event-ID: no event lost or repeated', async () => {
    const toolMayReturn = gate();
    const provider = await startProviderStandIn({
      reply: toolThenAnswer(
        () => [{ name: 'lookup', arguments: { q: 'x' } }],
        (results) => `found ${results.join(',')}, then an answer long enough to come in several chunks`,
      ),
    });
    afterThisTest(() => provider.close());
    const agents = (model: Parameters<typeof createAgent>[0]['model']) => ({
      researcher: createAgent({
        model,
        credentials: { apiKey: 'k' },
        tools: [
          tool<{ q: string }>({
            name: 'lookup',
            description: 'Look something up',
            parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
            execute: async ({ q }) => {
              await toolMayReturn.promise;
              return `result-${q}`;
            },
          }),
        ],
      }),
    });
    const databaseUrl = await freshDatabase();
    const a = await startTestServer({ provider, databaseUrl, agents });
    const b = await startTestServer({ provider, databaseUrl, agents });
    const token = await a.token({ tenant: 'client', role: 'member' });
    const balancer = await startSwitchProxy(a.server.url);
    const sluice = createClient({ baseUrl: balancer.url, token });

    const seen: StreamEvent[] = [];
    for await (const e of sluice.runs.stream('researcher', { input: 'look' })) {
      seen.push(e);
      if (e.event === 'tool.started') {
        // A executes the run; the connection drops; the client reconnects, now to B.
        balancer.switchTo(b.server.url);
        toolMayReturn.open();
      }
    }
    expect(seen.map((e) => e.id)).toEqual(seen.map((_, i) => i + 1));
    expect(seen.map((e) => e.event).slice(0, 4)).toEqual([
      'run.created',
      'run.started',
      'tool.started',
      'tool.completed',
    ]);
    expect(seen.at(-1)).toMatchObject({ event: 'run.completed', data: { status: 'succeeded' } });
    // Every event of the run, once: what B replays from the start.
    const replay: StreamEvent[] = [];
    const runId = (seen[0]!.data as { id: string }).id;
    for await (const e of createClient({ baseUrl: b.server.url, token }).runs.events(runId)) replay.push(e);
    expect(replay).toEqual(seen);
  });

  it('the same across two OS processes of the server: cut while the provider answers, resumed on the other process', async () => {
    const providerMayAnswer = gate();
    const provider = await startProviderStandIn({
      reply: async () => {
        await providerMayAnswer.promise;
        return { text: 'an answer long enough to come in several chunks, '.repeat(4) };
      },
    });
    afterThisTest(() => provider.close());
    const db = await testDatabase();
    const env = { DATABASE_URL: db.url, PROVIDER_URL: provider.url };
    const [a, b] = await Promise.all([startWorker(env), startWorker(env)]);
    const { secret: token } = await db.token({ tenant: 'client', role: 'member' });
    const balancer = await startSwitchProxy(a.url);
    const sluice = createClient({ baseUrl: balancer.url, token });

    const seen: StreamEvent[] = [];
    for await (const e of sluice.runs.stream('echo', { input: 'hello' })) {
      seen.push(e);
      if (e.event === 'run.started') {
        // Process A runs it and holds the provider request; the connection drops; the client
        // reconnects, now to process B, which follows the run from the database.
        balancer.switchTo(b.url);
        providerMayAnswer.open();
      }
    }
    expect(seen.map((e) => e.id)).toEqual(seen.map((_, i) => i + 1));
    expect(seen.slice(0, 2).map((e) => e.event)).toEqual(['run.created', 'run.started']);
    expect(seen.filter((e) => e.event === 'message.delta').length).toBeGreaterThan(1);
    expect(seen.at(-1)).toMatchObject({ event: 'run.completed', data: { status: 'succeeded' } });
    expect(provider.requests).toHaveLength(1);
    const replay: StreamEvent[] = [];
    const runId = (seen[0]!.data as { id: string }).id;
    for await (const e of createClient({ baseUrl: b.url, token }).runs.events(runId)) replay.push(e);
    expect(replay).toEqual(seen);
  });
});
