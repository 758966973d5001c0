import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../helpers.js';

async function setup(options: Parameters<typeof startTestServer>[0] = {}) {
  const seen: { role: string; content: unknown }[][] = [];
  const standIn = await startProviderStandIn({
    reply: (r) => {
      seen.push(r.messages.map((m) => ({ role: m.role, content: m.content })));
      const last = lastUserText(r);
      if (last.includes('stall')) return { stall: true };
      if (last.includes('fail')) return { status: 400, message: 'refused' };
      return { text: `chat: ${last}`, usage: { input: 3, output: 4 } };
    },
  });
  afterThisTest(() => standIn.close());
  const t = await startTestServer({ provider: standIn, ...options });
  const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
  return { t, client, standIn, seen };
}

describe('POST /chat/completions with the official openai client', () => {
  it('answers a chat.completion for the whole conversation sent, with usage that adds up; the run is in the runs API', async () => {
    const { client, seen, t } = await setup();
    const completion = await client.chat.completions.create({
      model: 'agent:echo',
      messages: [
        { role: 'developer', content: 'Answer briefly.' },
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'hello' },
        { role: 'user', content: [{ type: 'text', text: 'how are you?' }] },
      ],
    });
    expect(completion).toMatchObject({
      object: 'chat.completion',
      model: 'agent:echo',
      choices: [
        { index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'chat: how are you?' } },
      ],
      usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
    });
    expect(seen[0]).toEqual([
      { role: 'system', content: expect.stringContaining('Answer briefly.') },
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'hello' },
      { role: 'user', content: 'how are you?' },
    ]);
    expect(await t.statusOf(completion.id)).toMatchObject({ status: 'succeeded', class: 'default' });
  });

  it('streams chat.completion.chunk objects whose deltas add up to the answer, with usage when asked', async () => {
    const { client } = await setup();
    const stream = await client.chat.completions.create({
      model: 'agent:echo',
      messages: [{ role: 'user', content: 'a reply long enough to come in several pieces' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.every((c) => c.object === 'chat.completion.chunk')).toBe(true);
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
    expect(text).toBe('chat: a reply long enough to come in several pieces');
    expect(chunks.filter((c) => (c.choices[0]?.delta.content ?? '') !== '').length).toBeGreaterThan(1);
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe('stop');
    expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 });
  });

  it('a run that fails mid-stream ends the stream with an error the client raises; a failed plain call is a 502 naming the run, not retried by the client', async () => {
    const { client, t } = await setup();
    const stream = await client.chat.completions.create({
      model: 'agent:echo',
      messages: [{ role: 'user', content: 'please fail' }],
      stream: true,
    });
    const reading = (async () => {
      for await (const chunk of stream) void chunk;
    })();
    await expect(reading).rejects.toBeInstanceOf(OpenAI.APIError);
    const plain = await client.chat.completions
      .create({ model: 'agent:echo', messages: [{ role: 'user', content: 'fail again' }] })
      .catch((e: unknown) => e);
    expect(plain).toBeInstanceOf(OpenAI.InternalServerError);
    expect(plain).toMatchObject({ status: 502, code: 'run_failed' });
    // A client with its default retries does not send the failed run again: one run, not three.
    const retrying = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey });
    const before = (await t.call('GET', '/agents/runs?limit=1000')).body.data.length as number;
    await expect(
      retrying.chat.completions.create({
        model: 'agent:echo',
        messages: [{ role: 'user', content: 'fail once' }],
      }),
    ).rejects.toMatchObject({ status: 502 });
    expect((await t.call('GET', '/agents/runs?limit=1000')).body.data.length).toBe(before + 1);
  });

  it("service_tier 'flex' runs in the deferred class; caps, limits and bad input are refused as the client's errors", async () => {
    const { client, t, standIn } = await setup({ runs: { maxConcurrentPerUser: 1 } });
    const flex = await client.chat.completions.create({
      model: 'agent:echo',
      messages: [{ role: 'user', content: 'flexible' }],
      service_tier: 'flex',
    });
    expect(flex.service_tier).toBe('flex');
    expect((await t.statusOf(flex.id)).class).toBe('deferred');

    const holding = client.chat.completions.create({
      model: 'agent:echo',
      messages: [{ role: 'user', content: 'stall' }],
    });
    await until(() => standIn.inFlight === 1, 'one held run');
    const limited = await client.chat.completions
      .create({ model: 'agent:echo', messages: [{ role: 'user', content: 'x' }], stream: true })
      .catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(OpenAI.RateLimitError);
    expect(limited).toMatchObject({ code: 'agent_run_concurrency_limit', error: { scope: 'user' } });

    await expect(
      client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    ).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(
      client.chat.completions.create({
        model: 'agent:echo',
        messages: [{ role: 'tool', content: 'x', tool_call_id: 'c' }],
      }),
    ).rejects.toMatchObject({ status: 400, param: 'messages.0.role' });
    await expect(
      client.chat.completions.create({
        model: 'agent:echo',
        messages: Array.from({ length: 501 }, () => ({ role: 'user' as const, content: 'm' })),
      }),
    ).rejects.toMatchObject({ status: 413, code: 'request_too_large', error: { limit: 'messages' } });
    await t.server.close();
    await holding.catch(() => undefined);
  });
});
