import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../helpers.js';

/** A stand-in that says "answer: <last user text>", hangs on "stall", and remembers each request's messages. */
async function provider() {
  const seen: { role: string; content: unknown }[][] = [];
  const standIn = await startProviderStandIn({
    reply: (r) => {
      seen.push(r.messages.map((m) => ({ role: m.role, content: m.content })));
      const last = lastUserText(r);
      if (last.includes('stall')) return { stall: true };
      if (last.includes('fail')) return { status: 400, message: 'refused' };
      return { text: `answer: ${last}`, usage: { input: 7, output: 5 } };
    },
  });
  afterThisTest(() => standIn.close());
  return { standIn, seen };
}

async function setup(options: Parameters<typeof startTestServer>[0] = {}) {
  const { standIn, seen } = await provider();
  const t = await startTestServer({ provider: standIn, ...options });
  const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
  return { t, client, standIn, seen };
}

describe('POST /responses with the official openai client', () => {
  it('a string input: a completed response with every key the client types as required, usage adding up, metadata and service_tier echoed; it is a run of the runs API', async () => {
    const { t, client } = await setup();
    const response = await client.responses.create({
      model: 'agent:echo',
      input: 'hello there',
      metadata: { ticket: '17' },
    });
    expect(response).toMatchObject({
      object: 'response',
      status: 'completed',
      model: 'agent:echo',
      output_text: 'answer: hello there',
      metadata: { ticket: '17' },
      service_tier: 'default',
      background: false,
      error: null,
      incomplete_details: null,
      instructions: null,
      previous_response_id: null,
      parallel_tool_calls: true,
      temperature: null,
      top_p: null,
      tool_choice: 'auto',
      tools: [],
    });
    expect(response.output).toEqual([
      {
        id: expect.stringMatching(/^msg_/),
        type: 'message',
        status: 'completed',
        role: 'assistant',
        content: [{ type: 'output_text', text: 'answer: hello there', annotations: [], logprobs: [] }],
      },
    ]);
    expect(response.usage).toMatchObject({ input_tokens: 7, output_tokens: 5, total_tokens: 12 });
    expect(typeof response.created_at).toBe('number');
    const run = await t.statusOf(response.id);
    expect(run).toMatchObject({ id: response.id, class: 'default', status: 'succeeded' });
    expect(await client.responses.retrieve(response.id)).toMatchObject({
      id: response.id,
      status: 'completed',
    });
  });

  it('message input with instructions; previous_response_id continues the conversation as a thread', async () => {
    const { client, seen, t } = await setup();
    const first = await client.responses.create({
      model: 'agent:echo',
      instructions: 'Be terse.',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'my name is Ada' }] }],
    });
    expect(first.instructions).toBe('Be terse.');
    expect(seen[0]![0]).toEqual({ role: 'system', content: expect.stringContaining('Be terse.') });
    const second = await client.responses.create({
      model: 'agent:echo',
      input: 'what is my name?',
      previous_response_id: first.id,
    });
    expect(second.previous_response_id).toBe(first.id);
    expect(seen[1]!.slice(1)).toEqual([
      { role: 'user', content: 'my name is Ada' },
      { role: 'assistant', content: 'answer: my name is Ada' },
      { role: 'user', content: 'what is my name?' },
    ]);
    const third = await client.responses.create({
      model: 'agent:echo',
      input: 'again',
      previous_response_id: second.id,
    });
    expect(seen[2]!.map((m) => m.content).slice(-2)).toEqual(['answer: what is my name?', 'again']);
    const runs = await Promise.all([first, second, third].map((r) => t.statusOf(r.id)));
    expect(new Set(runs.map((r) => r.thread_id)).size).toBe(1);
    expect(runs[0]!.thread_id).toMatch(/^thr_/);

    const unknown = client.responses.create({
      model: 'agent:echo',
      input: 'x',
      previous_response_id: 'run_nope',
    });
    await expect(unknown).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    await expect(unknown).rejects.toMatchObject({
      code: 'previous_response_not_found',
      param: 'previous_response_id',
    });
  });

  it('background: answered at once as queued; retrieve until completed; cancel of a background response is cancelled and idempotent, of a foreground one 400', async () => {
    const { client, standIn } = await setup();
    const queued = await client.responses.create({
      model: 'agent:echo',
      input: 'stall please',
      background: true,
    });
    expect(queued).toMatchObject({ status: 'queued', background: true, output: [] });
    await until(() => standIn.inFlight === 1, 'the background run at the provider');
    expect((await client.responses.retrieve(queued.id)).status).toBe('in_progress');
    const cancelled = await client.responses.cancel(queued.id);
    expect(cancelled.status).toBe('cancelled');
    expect((await client.responses.cancel(queued.id)).status).toBe('cancelled');
    await until(() => standIn.inFlight === 0, 'the provider request aborted');

    const done = await client.responses.create({ model: 'agent:echo', input: 'quick', background: true });
    await until(async () => (await client.responses.retrieve(done.id)).status === 'completed', 'completed');
    const foreground = await client.responses.create({ model: 'agent:echo', input: 'fg' });
    await expect(client.responses.cancel(foreground.id)).rejects.toBeInstanceOf(OpenAI.BadRequestError);
  });

  it("service_tier 'flex' runs in the deferred class: counted in the deferred queue, echoed back", async () => {
    const { client, t, standIn } = await setup({ settings: { deferredMaxRunningPerTenant: 1 } });
    const first = await client.responses.create({
      model: 'agent:echo',
      input: 'stall 1',
      service_tier: 'flex',
      background: true,
    });
    const second = await client.responses.create({
      model: 'agent:echo',
      input: 'x 2',
      service_tier: 'flex',
      background: true,
    });
    expect(first.service_tier).toBe('flex');
    await until(() => standIn.inFlight === 1, 'one flex run at the provider');
    const queue = (await t.call('GET', '/agents/runs/queue')).body;
    expect(queue.deferred).toMatchObject({ running: 1, queued: 1 });
    expect((await t.statusOf(second.id)).class).toBe('deferred');
    await client.responses.cancel(first.id);
    await until(
      async () => (await client.responses.retrieve(second.id)).status === 'completed',
      'second done',
    );
  });

  it('a stream: Responses events in order with sequence numbers from 0; the stream helper gives the final response', async () => {
    const { client } = await setup();
    const stream = await client.responses.create({
      model: 'agent:echo',
      input: 'stream me a fairly long answer please',
      stream: true,
    });
    const events = [];
    for await (const event of stream) events.push(event);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const types = events.map((e) => e.type);
    expect(types.slice(0, 4)).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
    ]);
    expect(types.slice(-4)).toEqual([
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    const deltas = events.filter((e) => e.type === 'response.output_text.delta');
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.map((d) => (d as { delta: string }).delta).join('')).toBe(
      'answer: stream me a fairly long answer please',
    );

    const helper = client.responses.stream({ model: 'agent:echo', input: 'via the helper' });
    const texts: string[] = [];
    helper.on('response.output_text.delta', (e) => texts.push(e.delta));
    const final = await helper.finalResponse();
    expect(final.status).toBe('completed');
    expect(final.output_text).toBe('answer: via the helper');
    expect(texts.join('')).toBe('answer: via the helper');
  });

  it('refusals reach the client as its own error classes: 429 RateLimitError with Retry-After, 404 model_not_found, 400 naming the field, 401', async () => {
    const { client, t, standIn } = await setup({ settings: { maxActivePerTenant: 1 } });
    const holding = client.responses.create({ model: 'agent:echo', input: 'stall' });
    await until(() => standIn.inFlight === 1, 'one run holding the cap');
    const limited = await client.responses
      .create({ model: 'agent:echo', input: 'x' })
      .catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(OpenAI.RateLimitError);
    expect((limited as InstanceType<typeof OpenAI.RateLimitError>).headers.get('retry-after')).toMatch(
      /^([1-9]|[1-5]\d|60)$/,
    );
    expect(limited).toMatchObject({ status: 429, code: 'agent_run_concurrency_limit' });
    const streamLimited = await client.responses
      .create({ model: 'agent:echo', input: 'x', stream: true })
      .catch((e: unknown) => e);
    expect(streamLimited).toBeInstanceOf(OpenAI.RateLimitError);

    await expect(client.responses.create({ model: 'agent:nobody', input: 'x' })).rejects.toMatchObject({
      status: 404,
      code: 'model_not_found',
      param: 'model',
    });
    await expect(
      client.responses.create({ model: 'agent:echo', input: 'x', tools: [] } as never),
    ).rejects.toMatchObject({
      status: 400,
      param: 'tools',
    });
    await expect(
      client.responses.create({
        model: 'agent:echo',
        input: [
          { role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png', detail: 'auto' }] },
        ],
      }),
    ).rejects.toMatchObject({ status: 400, param: 'input.0.content.0.image_url' });
    await expect(
      client.responses.create({ model: 'agent:echo', input: 'c'.repeat(1_000_001) }),
    ).rejects.toMatchObject({ status: 413, code: 'request_too_large' });
    const stranger = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: 'nope', maxRetries: 0 });
    await expect(stranger.responses.create({ model: 'agent:echo', input: 'x' })).rejects.toBeInstanceOf(
      OpenAI.AuthenticationError,
    );
    const other = new OpenAI({
      baseURL: `${t.server.url}/api/client/v1`,
      apiKey: await t.token({ tenant: 'x' }),
      maxRetries: 0,
    });
    const mine = (await t.call('GET', '/agents/runs')).body.data[0].id as string;
    await expect(other.responses.retrieve(mine)).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(other.responses.cancel(mine)).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await t.server.close();
    await holding.catch(() => undefined);
  });

  it('the lifecycle: a failed run is status failed with an error, one past its timeout incomplete, and a call not done within AGENT_SYNC_TIMEOUT_MS is answered 202 with the response as it stands', async () => {
    const { client, standIn } = await setup({ runs: { timeoutMs: 2_000 }, settings: { syncTimeoutMs: 500 } });
    // On a slow machine even this may outlast the short sync window of this test: then it is polled.
    const created = await client.responses.create({ model: 'agent:echo', input: 'please fail' });
    await until(
      async () => (await client.responses.retrieve(created.id)).status === 'failed',
      'the run failing',
    );
    const failed = await client.responses.retrieve(created.id);
    expect(failed).toMatchObject({ status: 'failed', output: [], error: { code: 'server_error' } });
    expect(failed.error!.message).toMatch(/agent_error/);

    const pending = await client.responses.create({ model: 'agent:echo', input: 'stall' }).withResponse();
    expect(pending.response.status).toBe(202);
    expect(pending.data).toMatchObject({ status: 'in_progress', output: [] });
    await until(
      async () => (await client.responses.retrieve(pending.data.id)).status === 'incomplete',
      'the run timing out',
    );
    expect(await client.responses.retrieve(pending.data.id)).toMatchObject({
      status: 'incomplete',
      incomplete_details: { reason: 'timeout' },
    });
    await until(() => standIn.inFlight === 0, 'the provider request aborted');

    // Streamed, a failure is the response.failed event, and the helper's final response says so.
    const helper = client.responses.stream({ model: 'agent:echo', input: 'fail in a stream' });
    const final = await helper.finalResponse();
    expect(final.status).toBe('failed');
  });
});
