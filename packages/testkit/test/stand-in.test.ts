import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { replies, startProviderStandIn, until, type ProviderStandIn } from '@sluice/testkit';

const open: ProviderStandIn[] = [];
async function standIn(options: Parameters<typeof startProviderStandIn>[0] = {}) {
  const p = await startProviderStandIn(options);
  open.push(p);
  return p;
}
afterEach(async () => {
  for (const p of open.splice(0)) await p.close();
});
const client = (p: ProviderStandIn) => new OpenAI({ baseURL: p.url, apiKey: 'key-1', maxRetries: 0 });

describe('provider stand-in, driven by the openai client', () => {
  it('answers chat completions with text and with tool calls, streaming or not', async () => {
    const p = await standIn({
      reply: replies({ text: 'plain answer' }, { toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }] }),
    });
    const c = client(p);
    const first = await c.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(first.choices[0]!.message.content).toBe('plain answer');
    const stream = await c.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const calls: string[] = [];
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      for (const call of chunk.choices[0]?.delta.tool_calls ?? [])
        calls.push(call.function?.name ?? call.function?.arguments ?? '');
      finish ??= chunk.choices[0]?.finish_reason;
    }
    expect(calls).toEqual(['lookup', '{"q":"x"}']);
    expect(finish).toBe('tool_calls');
    expect(p.requests.map((r) => [r.apiKey, r.stream, r.done])).toEqual([
      ['key-1', false, true],
      ['key-1', true, true],
    ]);
  });

  it('counts requests in flight exactly, and keeps the peak', async () => {
    // No reply is given before all five have reached the responder, so they overlap whatever
    // the machine's load.
    let arrived = 0;
    const p = await standIn({
      reply: async () => {
        arrived++;
        await until(() => arrived === 5, { message: 'five requests at the responder' });
        return { text: 'ok' };
      },
    });
    const c = client(p);
    await Promise.all(
      Array.from({ length: 5 }, () =>
        c.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] }),
      ),
    );
    expect(p.peakInFlight).toBe(5);
    expect(p.inFlight).toBe(0);
  });

  it('injects a 429 with retry-after, and a stalled stream the client has to abort', async () => {
    const p = await standIn({ reply: replies({ status: 429, retryAfterSeconds: 7 }, { stall: true }) });
    const c = client(p);
    const error = await c.chat.completions
      .create({ model: 'm', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect((error as InstanceType<typeof OpenAI.APIError>).status).toBe(429);
    expect((error as InstanceType<typeof OpenAI.APIError>).headers?.get('retry-after')).toBe('7');

    const controller = new AbortController();
    const stream = await c.chat.completions.create(
      { model: 'm', messages: [{ role: 'user', content: 'x' }], stream: true },
      { signal: controller.signal },
    );
    const reading = (async () => {
      for await (const _ of stream) controller.abort();
    })().catch((e: unknown) => e);
    await reading;
    await p.idle();
    expect(p.requests[1]).toMatchObject({ aborted: true, done: false });
  });

  it('drops the connection mid-stream', async () => {
    const p = await standIn({ reply: () => ({ drop: 'mid-stream' }) });
    const stream = await client(p).chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'a long enough question to stream in several pieces' }],
      stream: true,
    });
    const outcome = await (async () => {
      for await (const _ of stream) {
        // read until the connection breaks
      }
    })().then(
      () => 'completed',
      () => 'failed',
    );
    expect(outcome).toBe('failed');
  });
});

describe('provider stand-in, Anthropic messages protocol', () => {
  it('answers a non-streaming request with text and tool use, and errors in the Anthropic shape', async () => {
    const p = await standIn({
      reply: replies(
        { toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }], text: 'let me look' },
        { status: 529 },
      ),
    });
    const post = () =>
      fetch(`${p.anthropicUrl}/v1/messages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': 'ak' },
        body: JSON.stringify({
          model: 'claude',
          max_tokens: 10,
          system: 'sys',
          messages: [{ role: 'user', content: 'hi' }],
        }),
      });
    const first = (await (await post()).json()) as { content: { type: string }[]; stop_reason: string };
    expect(first.content.map((c) => c.type)).toEqual(['text', 'tool_use']);
    expect(first.stop_reason).toBe('tool_use');
    const second = await post();
    expect(second.status).toBe(529);
    expect(await second.json()).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
    expect(p.requests.map((r) => r.apiKey)).toEqual(['ak', 'ak']);
  });
});
