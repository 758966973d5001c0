import { afterEach, describe, expect, it } from 'vitest';
import { RepairLimitError, createAgent, createConcurrencyLimiter, tool, type ConcurrencyEvent } from 'sluice';
import {
  replies,
  startProviderStandIn,
  type ProviderStandIn,
  type Reply,
  type StandInRequest,
} from '@sluice/testkit';

const standIns: ProviderStandIn[] = [];
afterEach(async () => {
  for (const p of standIns.splice(0)) await p.close();
});

async function setup(
  reply: (r: StandInRequest) => Reply | Promise<Reply>,
  extra: Record<string, unknown> = {},
) {
  // Every request the stand-in received, as JSON, in order.
  const seen: string[] = [];
  const p = await startProviderStandIn({
    reply: (r) => {
      seen.push(JSON.stringify(r.messages));
      return reply(r);
    },
  });
  standIns.push(p);
  const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
  const events: ConcurrencyEvent[] = [];
  const agent = createAgent({
    model: { api: 'openai-completions', provider: 'stand-in', id: 'm', baseUrl: p.url },
    credentials: { apiKey: 'k' },
    concurrency: { limiter },
    events: { onConcurrency: (e) => events.push(e) },
    tools: [
      tool<{ n: number }>({
        name: 'work',
        description: 'works on a number',
        parameters: { type: 'object', properties: { n: { type: 'number' } }, required: ['n'] },
        execute: ({ n }) => `worked on ${n}`,
      }),
    ],
    ...extra,
  });
  const acquired = () => events.filter((e) => e.type === 'acquired').length;
  return { p, agent, acquired, limiter, seen };
}

const text = (r: StandInRequest) => JSON.stringify(r.messages);

describe('repair turns', () => {
  it('a call to an unknown tool gets a corrective turn, a request with its own slot', async () => {
    const { p, agent, acquired } = await setup(
      replies({ toolCalls: [{ name: 'no_such_tool', arguments: {} }] }, { text: 'answered properly' }),
    );
    const result = await agent.run({ prompt: 'go' });
    expect(result.text).toBe('answered properly');
    expect(p.requests).toHaveLength(2);
    expect(acquired()).toBe(2);
  });

  it('arguments that fail the schema get a corrective turn that tells the model why', async () => {
    const { agent, acquired, seen } = await setup((r) =>
      r.index === 1 ? { toolCalls: [{ name: 'work', arguments: { n: 'lots' } }] } : { text: 'ok' },
    );
    await agent.run({ prompt: 'go' });
    expect(seen[1]).toMatch(/work/);
    expect(seen[1]).toMatch(/must be number|number/i);
    expect(acquired()).toBe(2);
  });

  it('gives up after maxRepairs corrective turns', async () => {
    const { p, agent } = await setup(() => ({ toolCalls: [{ name: 'no_such_tool', arguments: {} }] }), {
      maxRepairs: 2,
    });
    const error = await agent.run({ prompt: 'go' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RepairLimitError);
    expect(error).toMatchObject({ repairs: 2 });
    expect(p.requests).toHaveLength(3);
  });

  it('run({ schema }): a final answer that fails the schema is sent back until it fits', async () => {
    const { p, agent, acquired } = await setup(
      replies(
        { text: 'the answer is 42' },
        { text: '{"answer": "forty-two"}' },
        { text: '```json\n{"answer": 42}\n```' },
      ),
    );
    const result = await agent.run<{ answer: number }>({
      prompt: 'what is it?',
      schema: { type: 'object', properties: { answer: { type: 'number' } }, required: ['answer'] },
    });
    expect(result.data).toEqual({ answer: 42 });
    expect(p.requests).toHaveLength(3);
    expect(acquired()).toBe(3);
  });
});

describe('compaction', () => {
  it('summarises older messages once the conversation passes maxChars; the summary takes a slot', async () => {
    const { p, agent, acquired, seen } = await setup(
      (r) => {
        const system = String(r.messages.find((m) => m.role === 'system')?.content ?? '');
        if (system.includes('You compress conversations')) return { text: 'SUMMARY: worked on 1 and 2' };
        const done = r.messages.filter((m) => m.role === 'tool').length;
        if (done < 3 && !text(r).includes('SUMMARY'))
          return { toolCalls: [{ name: 'work', arguments: { n: done + 1 } }] };
        return { text: 'finished' };
      },
      { compaction: { maxChars: 1500, keepLast: 2 } },
    );
    const result = await agent.run({ prompt: `start ${'x'.repeat(600)}` });
    expect(result.text).toBe('finished');
    const summaryRequest = seen.findIndex((m) => m.includes('You compress conversations'));
    expect(summaryRequest).toBeGreaterThan(0);
    // The older messages went into the summary request; the next turn carried the summary instead.
    expect(seen[summaryRequest]).toContain('x'.repeat(600));
    expect(seen[summaryRequest + 1]).toContain('Summary of the conversation so far');
    expect(seen[summaryRequest + 1]).not.toContain('x'.repeat(600));
    expect(acquired()).toBe(p.requests.length);
  });

  it('a context-overflow error from the provider triggers a summary and a retry, each with a slot', async () => {
    const { p, agent, acquired, seen } = await setup(
      (r) => {
        const system = String(r.messages.find((m) => m.role === 'system')?.content ?? '');
        if (system.includes('You compress conversations')) return { text: 'SUMMARY of it' };
        if (!text(r).includes('SUMMARY'))
          return { status: 400, message: "This model's maximum context length is 100 tokens" };
        return { text: 'answered from the summary' };
      },
      { compaction: { keepLast: 0 } },
    );
    const result = await agent.run({ prompt: 'a very long question' });
    expect(result.text).toBe('answered from the summary');
    expect(p.requests).toHaveLength(3);
    expect(seen[1]).toContain('You compress conversations');
    expect(seen[2]).toContain('Summary of the conversation so far');
    expect(acquired()).toBe(3);
  });
});

describe('zod schemas for tools', () => {
  it('a zod schema types the arguments, is sent as JSON Schema, and validates the calls', async () => {
    const { z } = await import('zod');
    const seen: number[] = [];
    const p = await startProviderStandIn({
      reply: replies(
        { toolCalls: [{ name: 'double', arguments: { n: 'not a number' } }] },
        {
          toolCalls: [{ name: 'double', arguments: { n: 21 } }],
        },
        { text: 'done' },
      ),
    });
    standIns.push(p);
    const double = tool({
      name: 'double',
      description: 'Doubles a number',
      parameters: z.object({ n: z.number() }),
      execute: ({ n }) => {
        seen.push(n);
        return n * 2;
      },
    });
    expect(double.jsonSchema).toMatchObject({
      type: 'object',
      properties: { n: { type: 'number' } },
      required: ['n'],
    });
    const agent = createAgent({
      model: { api: 'openai-completions', provider: 'stand-in', id: 'm', baseUrl: p.url },
      credentials: { apiKey: 'k' },
      tools: [double],
    });
    expect((await agent.run({ prompt: 'go' })).text).toBe('done');
    // The bad call never reached execute; it was a repair turn.
    expect(seen).toEqual([21]);
  });
});
