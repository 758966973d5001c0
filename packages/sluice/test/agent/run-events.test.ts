import { describe, expect, it } from 'vitest';
import { createAgent, tool, type ToolEvent } from 'sluice';
import { toolThenAnswer } from '@sluice/testkit';
import { until, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

const longText = 'a reply long enough to come in several chunks from the stand-in';

/** A tool that waits until the test lets its call end, then returns or throws. */
function gatedTool(name: string, gates: Map<string, () => void>, outcome: 'return' | 'throw') {
  return tool({
    name,
    description: `${name} waits for the test`,
    parameters: { type: 'object', properties: {} },
    execute: async (_args, { toolCallId }) => {
      await new Promise<void>((resolve) => gates.set(toolCallId, resolve));
      if (outcome === 'throw') throw new Error(`${name} broke`);
      return `${name} done`;
    },
  });
}

describe('run events: onText', () => {
  it('hears every text delta of the answer as it streams; they join to result.text', async () => {
    const p = await f.provider({ reply: () => ({ text: longText }) });
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    const deltas: string[] = [];
    const result = await agent.run({ prompt: 'hi', events: { onText: (d) => deltas.push(d) } });
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.join('')).toBe(longText);
    expect(result.text).toBe(longText);
  });

  it('with stream(), the listener and the iteration both get every delta', async () => {
    const p = await f.provider({ reply: () => ({ text: longText }) });
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    const heard: string[] = [];
    const s = agent.stream({ prompt: 'hi', events: { onText: (d) => heard.push(d) } });
    const iterated: string[] = [];
    for await (const delta of s) iterated.push(delta);
    expect(iterated.length).toBeGreaterThan(1);
    expect(heard).toEqual(iterated);
    expect((await s.result).text).toBe(longText);
  });

  it('hears the text of every assistant turn, the one before a tool call too', async () => {
    const p = await f.provider({
      reply: (r) =>
        r.messages.some((m) => m.role === 'tool')
          ? { text: 'after the tool' }
          : { text: 'let me look. ', toolCalls: [{ name: 'lookup', arguments: {} }] },
    });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: [
        tool({
          name: 'lookup',
          description: 'looks up',
          parameters: { type: 'object', properties: {} },
          execute: () => 'found',
        }),
      ],
    });
    const deltas: string[] = [];
    const result = await agent.run({ prompt: 'go', events: { onText: (d) => deltas.push(d) } });
    expect(deltas.join('')).toBe('let me look. after the tool');
    expect(result.text).toBe('after the tool');
  });
});

describe('run events: onTool', () => {
  it('hears each call start (with its arguments) and end (with its result text) in order, with its name and id; a throw is an error', async () => {
    const p = await f.provider({
      reply: toolThenAnswer(() => [
        { name: 'lookup', arguments: {}, id: 'call_a' },
        { name: 'broken', arguments: {}, id: 'call_b' },
      ]),
    });
    const gates = new Map<string, () => void>();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: [gatedTool('lookup', gates, 'return'), gatedTool('broken', gates, 'throw')],
    });
    const log: ToolEvent[] = [];
    const run = agent.run({ prompt: 'go', events: { onTool: (e) => log.push(e) } });
    await until(() => gates.size === 2, { message: 'both tools to be called' });
    // The second call ends first: ends are heard in the order the calls finish.
    gates.get('call_b')!();
    await until(() => log.length === 3, { message: 'the end of call_b' });
    gates.get('call_a')!();
    const result = await run;
    expect(log).toEqual([
      { type: 'started', toolCallId: 'call_a', name: 'lookup', args: {} },
      { type: 'started', toolCallId: 'call_b', name: 'broken', args: {} },
      { type: 'completed', toolCallId: 'call_b', name: 'broken', isError: true, result: 'broken broke' },
      { type: 'completed', toolCallId: 'call_a', name: 'lookup', isError: false, result: 'lookup done' },
    ]);
    expect(result.text).toBe('Done: lookup done, broken broke');
  });

  it("does not hear the tool calls of a child agent's run", async () => {
    const p = await f.provider({
      reply: (r) => {
        const isChild = r.messages.some((m) => m.role === 'system' && String(m.content).includes('child'));
        const calls = isChild
          ? [{ name: 'child_tool', arguments: {}, id: 'child_call' }]
          : [{ name: 'ask_child', arguments: {}, id: 'parent_call' }];
        return toolThenAnswer(() => calls)(r);
      },
    });
    const childLog: ToolEvent[] = [];
    const child = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'You are the child.',
      clock: f.clock,
      tools: [
        tool({
          name: 'child_tool',
          description: 'the child tool',
          parameters: { type: 'object', properties: {} },
          execute: () => 'child result',
        }),
      ],
    });
    const parent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: [
        tool({
          name: 'ask_child',
          description: 'asks the child',
          parameters: { type: 'object', properties: {} },
          execute: async () =>
            (await child.run({ prompt: 'help', events: { onTool: (e) => childLog.push(e) } })).text,
        }),
      ],
    });
    const log: ToolEvent[] = [];
    const result = await parent.run({ prompt: 'go', events: { onTool: (e) => log.push(e) } });
    expect(result.text).toBe('Done: Done: child result');
    expect(log.map((e) => [e.type, e.toolCallId])).toEqual([
      ['started', 'parent_call'],
      ['completed', 'parent_call'],
    ]);
    expect(childLog.map((e) => [e.type, e.toolCallId])).toEqual([
      ['started', 'child_call'],
      ['completed', 'child_call'],
    ]);
  });
});

describe('run listeners cannot break a run', () => {
  it('a listener that throws on every event is ignored, and the run answers as usual', async () => {
    const p = await f.provider({ reply: toolThenAnswer(() => [{ name: 'lookup', arguments: {} }]) });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: [
        tool({
          name: 'lookup',
          description: 'looks up',
          parameters: { type: 'object', properties: {} },
          execute: () => 'found',
        }),
      ],
    });
    let calls = 0;
    const throwing = () => {
      calls++;
      throw new Error('listener bug');
    };
    const s = agent.stream({ prompt: 'go', events: { onText: throwing, onTool: throwing } });
    const deltas: string[] = [];
    for await (const delta of s) deltas.push(delta);
    const result = await s.result;
    expect(result.text).toBe('Done: found');
    expect(deltas.join('')).toBe('Done: found');
    // Both tool events and every delta reached the listener, which threw each time.
    expect(calls).toBe(2 + deltas.length);
  });

  it('refuses a listener that is not a function, naming it, before any request', async () => {
    const p = await f.provider();
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    await expect(agent.run({ prompt: 'hi', events: { onTool: 'log' as never } })).rejects.toThrow(
      new TypeError('Expected `events.onTool` to be a function, got `"log"`'),
    );
    expect(p.requests).toEqual([]);
  });
});
