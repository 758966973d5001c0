import { describe, expect, it } from 'vitest';
import { askHuman, createAgent, tool, type PausedRun, type RunResult, type ToolEvent } from 'sluice';
import type { StandInRequest } from '@sluice/testkit';
import { useAgentFixture } from './agent/fixture.js';

const f = useAgentFixture();

const toolResults = (request: StandInRequest): Record<string, string> =>
  Object.fromEntries(
    request.messages.filter((m) => m.role === 'tool').map((m) => [m.tool_call_id!, String(m.content)]),
  );

/** First turn: asks (ask_human, and `pick` without a `question` argument); then says what it was told. */
const script = (request: StandInRequest) => {
  const told = toolResults(request);
  if (Object.keys(told).length === 0)
    return {
      text: 'One moment. ',
      toolCalls: [
        { id: 'call_q', name: 'ask_human', arguments: { question: 'Which city?' } },
        { id: 'call_p', name: 'pick', arguments: { options: ['a', 'b'] } },
      ],
    };
  return { text: `told: ${told.call_q} | ${told.call_p}` };
};

const pick = tool({
  name: 'pick',
  description: 'the user picks one option',
  parameters: { type: 'object', properties: { options: { type: 'array', items: { type: 'string' } } } },
  ask: true,
});

function paused(result: RunResult): PausedRun {
  expect(result.status).toBe('requires_action');
  return result as PausedRun;
}

describe('questions for a person in the runtime', () => {
  it('pauses on ask calls holding no slot, and the answers become the results the model reads', async () => {
    const asked: StandInRequest[] = [];
    const p = await f.provider({
      reply: (r) => {
        asked.push(r);
        return script(r);
      },
    });
    const limiter = f.limiter();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      concurrency: { limiter },
      tools: [askHuman, pick],
    });
    const first = paused(await agent.run({ prompt: 'book a trip' }));
    expect(first.pendingToolCalls).toEqual([
      {
        id: 'call_q',
        name: 'ask_human',
        arguments: { question: 'Which city?' },
        kind: 'question',
        question: 'Which city?',
      },
      // No `question` argument: the person reads the arguments as JSON.
      {
        id: 'call_p',
        name: 'pick',
        arguments: { options: ['a', 'b'] },
        kind: 'question',
        question: '{"options":["a","b"]}',
      },
    ]);
    expect((await limiter.stats()).active).toBe(0);
    // The model offered the tools as any other, with ask_human's one string argument.
    const offered = asked[0]!.tools as { function: { name: string; parameters: unknown } }[];
    expect(offered.map((t) => t.function.name)).toEqual(['ask_human', 'pick']);
    expect(offered[0]!.function.parameters).toMatchObject({ required: ['question'] });

    const heard: ToolEvent[] = [];
    const done = await agent.resume({
      paused: JSON.parse(JSON.stringify(first.state)) as PausedRun['state'],
      decisions: [
        { toolCallId: 'call_p', answer: 'b' },
        { toolCallId: 'call_q', answer: 'Lisbon' },
      ],
      events: { onTool: (e) => heard.push(e) },
    });
    expect(done.status).toBe('completed');
    expect(done.text).toBe('told: Lisbon | b');
    expect(heard.map((e) => `${e.type} ${e.name}`)).toEqual([
      'started ask_human',
      'completed ask_human',
      'started pick',
      'completed pick',
    ]);
    expect(done.usage.requests).toBe(2);
  });

  it('refuses a resume that leaves a question unanswered, answers it with no text, or approves it, before sending anything', async () => {
    const p = await f.provider({ reply: script });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: [askHuman, pick],
    });
    const { state } = paused(await agent.run({ prompt: 'go' }));
    const sent = p.requests.length;
    await expect(
      agent.resume({ paused: state, decisions: [{ toolCallId: 'call_q', answer: 'x' }] }),
    ).rejects.toThrow(/`decisions` to be an answer for every pending call \(missing: call_p\)/);
    await expect(
      agent.resume({
        paused: state,
        decisions: [
          { toolCallId: 'call_q', approved: true },
          { toolCallId: 'call_p', answer: 'a' },
        ],
      }),
    ).rejects.toThrow(/`decisions\[0\]\.answer` to be the answer, a string, got `undefined`/);
    await expect(
      agent.resume({
        paused: state,
        decisions: [
          { toolCallId: '__proto__', answer: 'x' },
          { toolCallId: 'call_p', answer: 'a' },
        ],
      }),
    ).rejects.toThrow(/`decisions\[0\]\.toolCallId` to be one of the pending calls \(call_q, call_p\)/);
    expect(p.requests.length).toBe(sent);
  });

  it('an ask tool is refused at definition with an execute or a needsApproval, and a tool with neither execute nor ask', () => {
    const base = { name: 'x', description: 'x', parameters: { type: 'object' } };
    expect(() => tool({ ...base, ask: true, execute: () => 'x' } as never)).toThrow(
      /`tool\.execute` of `x` to be absent: a tool with `ask: true` is answered by a person/,
    );
    expect(() => tool({ ...base, ask: true, needsApproval: true } as never)).toThrow(
      /`tool\.needsApproval` of `x` to be absent/,
    );
    expect(() => tool({ ...base, ask: 'yes' } as never)).toThrow(/`tool\.ask` of `x` to be true or false/);
    expect(() => tool(base as never)).toThrow(/`tool\.execute` of `x` to be a function \(or `ask: true`/);
  });
});
