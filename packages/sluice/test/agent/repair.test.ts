import { describe, expect, it } from 'vitest';
import { RepairLimitError, createAgent, tool, type AgentOptions } from 'sluice';
import { replies, type Reply, type StandInRequest } from '@sluice/testkit';
import { eventLog, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

const work = tool<{ n: number }>({
  name: 'work',
  description: 'works on a number',
  parameters: { type: 'object', properties: { n: { type: 'number' } }, required: ['n'] },
  execute: ({ n }) => `worked on ${n}`,
});

/** An agent with the `work` tool on a stand-in, and what the stand-in received. */
async function setup(
  reply: (r: StandInRequest) => Reply | Promise<Reply>,
  extra: Partial<AgentOptions<'default'>> = {},
) {
  // Every request the stand-in received, in order.
  const seen: StandInRequest[] = [];
  const p = await f.provider({
    reply: (r) => {
      seen.push(r);
      return reply(r);
    },
  });
  const limiter = f.limiter();
  const log = eventLog();
  const agent = createAgent({
    model: f.model(p),
    credentials: f.credentials,
    concurrency: { limiter },
    clock: f.clock,
    events: { onConcurrency: log.onConcurrency },
    tools: [work],
    ...extra,
  });
  return {
    p,
    agent,
    acquired: () => log.of('acquired').length,
    seen,
    json: (i: number) => JSON.stringify(seen[i]!.messages),
  };
}

const toolResults = (r: StandInRequest) => r.messages.filter((m) => m.role === 'tool').map((m) => m.content);
const systemOf = (r: StandInRequest) => String(r.messages.find((m) => m.role === 'system')?.content ?? '');

describe('repair turns', () => {
  it('a call to an unknown tool gets a corrective turn, a request with its own slot', async () => {
    const { p, agent, acquired, seen } = await setup(
      replies({ toolCalls: [{ name: 'no_such_tool', arguments: {} }] }, { text: 'answered properly' }),
    );
    const result = await agent.run({ prompt: 'go' });
    expect(result.text).toBe('answered properly');
    expect(p.requests).toHaveLength(2);
    expect(acquired()).toBe(2);
    expect(toolResults(seen[1]!)).toEqual(['Tool no_such_tool not found']);
  });

  it('arguments that fail the schema get a corrective turn that tells the model why', async () => {
    const { agent, acquired, seen } = await setup((r) =>
      r.index === 1 ? { toolCalls: [{ name: 'work', arguments: { n: 'lots' } }] } : { text: 'ok' },
    );
    await agent.run({ prompt: 'go' });
    expect(toolResults(seen[1]!)).toEqual([
      'Validation failed for tool "work":\n  - n: must be number\n\nReceived arguments:\n{\n  "n": "lots"\n}',
    ]);
    expect(acquired()).toBe(2);
  });

  it('gives up after maxRepairs corrective turns, with RepairLimitError', async () => {
    const { p, agent } = await setup(() => ({ toolCalls: [{ name: 'no_such_tool', arguments: {} }] }), {
      maxRepairs: 2,
    });
    const error = await agent.run({ prompt: 'go' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RepairLimitError);
    expect(error).toMatchObject({
      name: 'RepairLimitError',
      repairs: 2,
      lastProblem: 'unknown tool `no_such_tool`',
      limiter: 'default',
      workload: 'default',
      parentRunId: undefined,
    });
    expect((error as RepairLimitError).message).toBe(
      `Run ${(error as RepairLimitError).runId} gave up after 2 corrective turns: unknown tool \`no_such_tool\``,
    );
    expect(p.requests).toHaveLength(3);
  });

  it('run({ schema }): a final answer that fails the schema is sent back until it fits', async () => {
    const { p, agent, acquired, seen } = await setup(
      replies(
        { text: 'the answer is 42' },
        { text: '{"answer": "forty-two"}' },
        { text: '```json\n{"answer": 42}\n```' },
      ),
    );
    const schema = { type: 'object', properties: { answer: { type: 'number' } }, required: ['answer'] };
    const result = await agent.run<{ answer: number }>({ prompt: 'what is it?', schema });
    expect(result.data).toEqual({ answer: 42 });
    expect(p.requests).toHaveLength(3);
    expect(acquired()).toBe(3);
    const corrections = seen.map((r) => r.messages.at(-1)!.content);
    expect(corrections[1]).toMatch(/^Your answer cannot be used: the answer is not JSON \(/);
    expect(corrections[2]).toMatch(
      /^Your answer cannot be used: Validation failed for tool "answer":\n {2}- answer: must be number\n/,
    );
    expect(corrections[2]).toContain(`matches this JSON Schema: ${JSON.stringify(schema)}`);
  });
});

describe('compaction', () => {
  it('summarises older messages once the conversation passes maxChars; the summary takes a slot', async () => {
    const { p, agent, acquired, seen, json } = await setup(
      (r) => {
        if (systemOf(r).includes('You compress conversations')) return { text: 'SUMMARY: worked on 1 and 2' };
        const done = r.messages.filter((m) => m.role === 'tool').length;
        if (done < 3 && !JSON.stringify(r.messages).includes('SUMMARY'))
          return { toolCalls: [{ name: 'work', arguments: { n: done + 1 } }] };
        return { text: 'finished' };
      },
      { compaction: { maxChars: 1500, keepLast: 2 } },
    );
    const result = await agent.run({ prompt: `start ${'x'.repeat(600)}` });
    expect(result.text).toBe('finished');
    const summaryRequest = seen.findIndex((r) => systemOf(r).includes('You compress conversations'));
    expect(summaryRequest).toBeGreaterThan(0);
    // The older messages went into the summary request; the next turn carried the summary instead.
    expect(json(summaryRequest)).toContain('x'.repeat(600));
    expect(json(summaryRequest + 1)).toContain(
      'Summary of the conversation so far:\\nSUMMARY: worked on 1 and 2',
    );
    expect(json(summaryRequest + 1)).not.toContain('x'.repeat(600));
    expect(acquired()).toBe(p.requests.length);
    expect(result.usage.requests).toBe(p.requests.length);
  });

  it('a context-overflow error from the provider triggers a summary and a retry, each with a slot', async () => {
    const { p, agent, acquired, seen, json } = await setup(
      (r) => {
        if (systemOf(r).includes('You compress conversations')) return { text: 'SUMMARY of it' };
        if (!JSON.stringify(r.messages).includes('SUMMARY'))
          return { status: 400, message: "This model's maximum context length is 100 tokens" };
        return { text: 'answered from the summary' };
      },
      { compaction: { keepLast: 0 } },
    );
    const result = await agent.run({ prompt: 'a very long question' });
    expect(result.text).toBe('answered from the summary');
    expect(p.requests).toHaveLength(3);
    expect(systemOf(seen[1]!)).toContain('You compress conversations');
    expect(json(2)).toContain('Summary of the conversation so far:\\nSUMMARY of it');
    expect(acquired()).toBe(3);
    expect(result.usage.requests).toBe(3);
  });

  it('a summary that fails ends the run with its failure, and no further request is sent', async () => {
    const { p, agent, seen } = await setup(
      (r) => {
        if (systemOf(r).includes('You compress conversations'))
          return { status: 400, message: 'no summaries today' };
        return { toolCalls: [{ name: 'work', arguments: { n: 1 } }] };
      },
      { compaction: { maxChars: 10, keepLast: 0 } },
    );
    const error = await agent
      .run({ prompt: 'a question longer than ten characters' })
      .catch((e: unknown) => e);
    expect((error as Error).message).toBe('Provider request failed with HTTP 400: 400 no summaries today');
    // The first turn was already too long: its summary failed and nothing else was sent.
    expect(p.requests).toHaveLength(1);
    expect(systemOf(seen[0]!)).toContain('You compress conversations');
  });
});

describe('zod schemas for tools', () => {
  it('a zod schema types the arguments, is sent as JSON Schema, and validates the calls', async () => {
    const { z } = await import('zod');
    const seen: number[] = [];
    const p = await f.provider({
      reply: replies(
        { toolCalls: [{ name: 'double', arguments: { n: 'not a number' } }] },
        { toolCalls: [{ name: 'double', arguments: { n: 21 } }] },
        { text: 'done' },
      ),
    });
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
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, tools: [double] });
    expect((await agent.run({ prompt: 'go' })).text).toBe('done');
    // The bad call never reached execute; it was a repair turn.
    expect(seen).toEqual([21]);
  });
});
