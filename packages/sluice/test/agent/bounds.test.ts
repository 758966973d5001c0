import { describe, expect, it } from 'vitest';
import {
  ConcurrencyTimeoutError,
  RunTimeoutError,
  TurnError,
  createAgent,
  tool,
  type ConcurrencyEvent,
} from 'sluice';
import { toolThenAnswer } from '@sluice/testkit';
import { eventLog, until, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

describe('run bounds', () => {
  it("a run's timeoutMs cancels it cleanly: the request is aborted at the provider and the slot is back", async () => {
    const p = await f.provider({ reply: () => ({ stall: true }) });
    const limiter = f.limiter();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
    });
    const run = agent.run({ prompt: 'hi', timeoutMs: 200 }).catch((e: unknown) => e);
    await until(() => p.inFlight === 1, { message: 'the request to reach the stand-in' });
    f.clock.advance(199);
    expect(p.requests[0]).toMatchObject({ aborted: false });
    f.clock.advance(1);
    const error = await run;
    expect(error).toBeInstanceOf(RunTimeoutError);
    expect(error).toMatchObject({
      name: 'RunTimeoutError',
      timeoutMs: 200,
      limiter: 'default',
      workload: 'default',
      parentRunId: undefined,
    });
    expect((error as RunTimeoutError).rootRunId).toBe((error as RunTimeoutError).runId);
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('a tool past toolTimeoutMs fails with an error result the model sees, even if it ignores its signal', async () => {
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
      bounds: { toolTimeoutMs: 100 },
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
    const run = agent.run({ prompt: 'go' });
    await toolCalled;
    expect(f.clock.foregroundTimers).toEqual([{ ms: 100, background: false }]);
    f.clock.advance(100);
    const result = await run;
    expect(result.text).toBe('model saw: Tool hang passed toolTimeoutMs (100 ms)');
  });

  it('a provider request past turnTimeoutMs fails the run with TurnError', async () => {
    const p = await f.provider({ reply: () => ({ stall: true }) });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      bounds: { turnTimeoutMs: 150 },
      clock: f.clock,
    });
    const run = agent.run({ prompt: 'hi' }).catch((e: unknown) => e);
    await until(() => p.inFlight === 1, { message: 'the request to reach the stand-in' });
    f.clock.advance(150);
    const error = await run;
    expect(error).toBeInstanceOf(TurnError);
    expect((error as Error).message).toBe('Provider request took longer than turnTimeoutMs (150 ms)');
    expect(error).toMatchObject({ retryable: false, limiter: 'none', requestId: expect.any(String) });
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
  });

  it('refuses bad bounds and models at creation, naming the field', () => {
    const model = {
      api: 'openai-completions' as const,
      provider: 'x',
      id: 'y',
      baseUrl: 'http://127.0.0.1:9/v1',
    };
    expect(() => createAgent({ model, bounds: { maxParallelToolCalls: 0 } })).toThrow(
      'Expected `bounds.maxParallelToolCalls` to be a whole number >= 1, got `0`',
    );
    expect(() => createAgent({ model, bounds: { toolTimeoutMs: -5 } })).toThrow(
      'Expected `bounds.toolTimeoutMs` to be a number of ms > 0 and at most 2147483647, got `-5`',
    );
    expect(() => createAgent({ model: 'no-slash' })).toThrow("Expected `model` to be 'provider/model-id'");
    expect(() => createAgent({ model: 'acme/unknown-model' })).toThrow('Unknown model `acme/unknown-model`');
    expect(() => createAgent({ model: { ...model, api: 'smoke-signals' as never } })).toThrow(
      'Expected `model.api`',
    );
    expect(() => createAgent({ model, credentials: { apiKey: '' } })).toThrow(
      'Expected `credentials.apiKey`',
    );
  });
});

describe('a run budget that ends during a slot wait', () => {
  // The budget's end used to be seen by two timers (the run's and the limiter's), and the
  // event said `wait-cancelled` or `timed-out` by which fired first. On one ManualClock both
  // fall due at the same instant, in the order they were set: the run's first. So every
  // round below is the race the old code lost.
  it('always ends in timed-out and ConcurrencyTimeoutError, never wait-cancelled (50 rounds)', async () => {
    const p = await f.provider();
    const limiter = f.limiter({ workloads: { default: { maxWaitMs: 150 } } });
    const held = await limiter.acquire();
    for (let round = 0; round < 50; round++) {
      const log = eventLog();
      const agent = createAgent({
        model: f.model(p),
        credentials: f.credentials,
        concurrency: { limiter },
        clock: f.clock,
        events: { onConcurrency: log.onConcurrency },
      });
      // Even rounds: the limiter's maxWaitMs ends the wait at the same instant as the budget.
      const run = agent
        .run({ prompt: 'hi', timeoutMs: round % 2 === 0 ? 150 : 100 })
        .catch((e: unknown) => e);
      await log.seen('wait-started');
      f.clock.advance(round % 2 === 0 ? 150 : 100);
      const error = await run;
      expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
      expect(log.types()).toEqual(['wait-started', 'timed-out']);
      expect(log.events[1]).toMatchObject({ waitMs: round % 2 === 0 ? 150 : 100 });
    }
    expect(p.requests).toHaveLength(0);
    await limiter.release(held);
  });

  it("in a child run whose parent's budget ends first, too", async () => {
    const p = await f.provider({ reply: toolThenAnswer(() => [{ name: 'ask_child', arguments: {} }]) });
    const limiter = f.limiter();
    const log = eventLog();
    const child = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    let blocker: Awaited<ReturnType<typeof limiter.acquire>> | undefined;
    let childError: unknown;
    const parent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
      events: { onConcurrency: log.onConcurrency },
      tools: [
        tool({
          name: 'ask_child',
          description: 'asks the child',
          parameters: { type: 'object', properties: {} },
          execute: async () => {
            // The parent's turn is over and its slot back: take it, so the child has to wait.
            blocker = await limiter.acquire();
            return child.run({ prompt: 'hi', timeoutMs: 10_000 }).catch((e: unknown) => {
              childError = e;
              throw e;
            });
          },
        }),
      ],
    });
    // The parent's timer is set first, so it fires first at the shared instant.
    const run = parent.run({ prompt: 'go', timeoutMs: 500 }).catch((e: unknown) => e);
    await log.seen('wait-started', 2);
    f.clock.advance(500);
    expect(await run).toBeInstanceOf(RunTimeoutError);
    expect(childError).toBeInstanceOf(ConcurrencyTimeoutError);
    const childEvents = log.events.filter((e: ConcurrencyEvent) => e.parentRunId !== undefined);
    expect(childEvents.map((e) => e.type)).toEqual(['wait-started', 'timed-out']);
    expect(childEvents[1]).toMatchObject({ waitMs: 500 });
    await limiter.release(blocker!);
  });
});
