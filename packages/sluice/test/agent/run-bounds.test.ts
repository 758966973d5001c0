import { setImmediate as nextTurn } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { TurnError, createAgent, tool, type RunBounds } from 'sluice';
import { toolThenAnswer } from '@sluice/testkit';
import { runBounds } from '../../src/agent/options.js';
import { until, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

describe('per-run bounds: maxParallelToolCalls', () => {
  it.each<[string, RunBounds | undefined, RunBounds | undefined, number]>([
    [
      'a run bound lower than the agent’s applies',
      { maxParallelToolCalls: 10 },
      { maxParallelToolCalls: 2 },
      2,
    ],
    [
      'a run bound higher than the agent’s does not raise it',
      { maxParallelToolCalls: 2 },
      { maxParallelToolCalls: 5 },
      2,
    ],
    // The control: unbounded, all five run at once, so the two cases above can fail.
    ['without a run bound, the agent’s applies', { maxParallelToolCalls: 10 }, undefined, 5],
  ])('%s', async (_, agentBounds, bounds, width) => {
    const p = await f.provider({
      reply: toolThenAnswer(
        () => Array.from({ length: 5 }, (_, i) => ({ name: 'work', arguments: {}, id: `call_${i}` })),
        (results) => `finished ${results.length}`,
      ),
    });
    const log: string[] = [];
    const gates = new Map<string, () => void>();
    let running = 0;
    let peak = 0;
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      bounds: agentBounds,
      tools: [
        tool({
          name: 'work',
          description: 'waits for the test',
          parameters: { type: 'object', properties: {} },
          execute: async (_args, { toolCallId }) => {
            log.push(`enter ${toolCallId}`);
            peak = Math.max(peak, ++running);
            await new Promise<void>((resolve) => gates.set(toolCallId, resolve));
            running--;
            log.push(`exit ${toolCallId}`);
            return toolCallId;
          },
        }),
      ],
    });
    const run = agent.run({ prompt: 'go', bounds });
    const entered = () => log.filter((line) => line.startsWith('enter')).length;
    for (let released = 0; released < 5; released++) {
      const expected = Math.min(5, released + width);
      await until(() => entered() === expected, { message: `${expected} calls to start` });
      // Another turn of the event loop: a call the bound did not hold back would have started.
      await nextTurn();
      expect(entered()).toBe(expected);
      gates.get(`call_${released}`)!();
      await until(() => log.includes(`exit call_${released}`), { message: `call_${released} to end` });
    }
    expect((await run).text).toBe('finished 5');
    expect(peak).toBe(width);
  });
});

describe('per-run bounds: timeouts', () => {
  it('a run toolTimeoutMs applies where the agent has none, on the agent clock', async () => {
    const p = await f.provider({
      reply: toolThenAnswer(
        () => [{ name: 'hang', arguments: {} }],
        (results) => `model saw: ${results[0]}`,
      ),
    });
    let called!: () => void;
    const toolCalled = new Promise<void>((resolve) => (called = resolve));
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: [
        tool({
          name: 'hang',
          description: 'never returns',
          parameters: { type: 'object', properties: {} },
          execute: () => {
            called();
            return new Promise(() => undefined);
          },
        }),
      ],
    });
    const run = agent.run({ prompt: 'go', bounds: { toolTimeoutMs: 100 } });
    await toolCalled;
    expect(f.clock.foregroundTimers).toEqual([{ ms: 100, background: false }]);
    f.clock.advance(100);
    expect((await run).text).toBe('model saw: Tool hang passed toolTimeoutMs (100 ms)');
  });

  it.each<[string, number, number, number]>([
    ['the run’s, when shorter', 5000, 100, 100],
    ['the agent’s, when the run asks for longer', 100, 5000, 100],
  ])('with both set, toolTimeoutMs is the shorter: %s', async (_, agentMs, runMs, applies) => {
    const p = await f.provider({
      reply: toolThenAnswer(
        () => [{ name: 'hang', arguments: {} }],
        (results) => `model saw: ${results[0]}`,
      ),
    });
    let called!: () => void;
    const toolCalled = new Promise<void>((resolve) => (called = resolve));
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      bounds: { toolTimeoutMs: agentMs },
      tools: [
        tool({
          name: 'hang',
          description: 'never returns',
          parameters: { type: 'object', properties: {} },
          execute: () => {
            called();
            return new Promise(() => undefined);
          },
        }),
      ],
    });
    const run = agent.run({ prompt: 'go', bounds: { toolTimeoutMs: runMs } });
    await toolCalled;
    expect(f.clock.foregroundTimers).toEqual([{ ms: applies, background: false }]);
    f.clock.advance(applies);
    expect((await run).text).toBe(`model saw: Tool hang passed toolTimeoutMs (${applies} ms)`);
  });

  it('a run turnTimeoutMs fails a stalled provider request with TurnError', async () => {
    const p = await f.provider({ reply: () => ({ stall: true }) });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      bounds: { turnTimeoutMs: 60_000 },
    });
    const run = agent.run({ prompt: 'hi', bounds: { turnTimeoutMs: 150 } }).catch((e: unknown) => e);
    await until(() => p.inFlight === 1, { message: 'the request to reach the stand-in' });
    expect(f.clock.foregroundTimers).toEqual([{ ms: 150, background: false }]);
    f.clock.advance(150);
    const error = await run;
    expect(error).toBeInstanceOf(TurnError);
    expect((error as Error).message).toBe('Provider request took longer than turnTimeoutMs (150 ms)');
    await p.idle();
  });
});

describe('per-run bounds: checks and merging', () => {
  it.each<[unknown, string]>([
    [
      { maxParallelToolCalls: 0 },
      'Expected `bounds.maxParallelToolCalls` to be a whole number >= 1, got `0`',
    ],
    [
      { maxParallelToolCalls: 1.5 },
      'Expected `bounds.maxParallelToolCalls` to be a whole number >= 1, got `1.5`',
    ],
    [
      { toolTimeoutMs: -5 },
      'Expected `bounds.toolTimeoutMs` to be a number of ms > 0 and at most 2147483647, got `-5`',
    ],
    [
      { turnTimeoutMs: '10s' },
      'Expected `bounds.turnTimeoutMs` to be a number of ms > 0 and at most 2147483647, got `"10s"`',
    ],
    [
      { maxParallel: 2 },
      'Expected `bounds.maxParallel` to be one of maxParallelToolCalls, toolTimeoutMs, turnTimeoutMs (misspelt?), got `"maxParallel"`',
    ],
    [5, 'Expected `bounds` to be an object, got `5`'],
  ])('refuses run bounds %j before any request', async (bounds, message) => {
    const p = await f.provider();
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    await expect(agent.run({ prompt: 'hi', bounds: bounds as RunBounds })).rejects.toThrow(
      new TypeError(message),
    );
    expect(p.requests).toEqual([]);
  });

  it('takes the smaller value where both are set, and either alone where one is', () => {
    const agent = Object.freeze({ maxParallelToolCalls: 10, toolTimeoutMs: 1000, turnTimeoutMs: undefined });
    expect(runBounds(agent, undefined)).toBe(agent);
    expect(runBounds(agent, {})).toEqual(agent);
    expect(runBounds(agent, { maxParallelToolCalls: 3, toolTimeoutMs: 2000, turnTimeoutMs: 500 })).toEqual({
      maxParallelToolCalls: 3,
      toolTimeoutMs: 1000,
      turnTimeoutMs: 500,
    });
    expect(runBounds(agent, { maxParallelToolCalls: 20, toolTimeoutMs: 10 })).toEqual({
      maxParallelToolCalls: 10,
      toolTimeoutMs: 10,
      turnTimeoutMs: undefined,
    });
  });
});
