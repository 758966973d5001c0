import { afterEach, describe, expect, it } from 'vitest';
import { RunTimeoutError, TurnError, createAgent, createConcurrencyLimiter, tool } from 'sluice';
import {
  startProviderStandIn,
  toolThenAnswer,
  type ProviderStandIn,
  type StandInOptions,
} from '@sluice/testkit';

const standIns: ProviderStandIn[] = [];
afterEach(async () => {
  for (const p of standIns.splice(0)) await p.close();
});
async function provider(options: StandInOptions) {
  const p = await startProviderStandIn(options);
  standIns.push(p);
  return p;
}
const modelOf = (p: ProviderStandIn) => ({
  api: 'openai-completions' as const,
  provider: 'stand-in',
  id: 'm',
  baseUrl: p.url,
});

describe('run bounds', () => {
  it("a run's timeoutMs cancels it cleanly: the request is aborted at the provider and the slot is back", async () => {
    const p = await provider({ reply: () => ({ stall: true }) });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const agent = createAgent({ model: modelOf(p), credentials: { apiKey: 'k' }, concurrency: { limiter } });
    const error = await agent.run({ prompt: 'hi', timeoutMs: 200 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunTimeoutError);
    expect(error).toMatchObject({ timeoutMs: 200 });
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('a tool past toolTimeoutMs fails with an error result the model sees, even if it ignores its signal', async () => {
    const seen: string[] = [];
    const p = await provider({
      reply: (r) => {
        seen.push(JSON.stringify(r.messages));
        return toolThenAnswer(
          () => [{ name: 'hang', arguments: {} }],
          (results) => `model saw: ${results[0]}`,
        )(r);
      },
    });
    const agent = createAgent({
      model: modelOf(p),
      credentials: { apiKey: 'k' },
      bounds: { toolTimeoutMs: 100 },
      tools: [
        tool({
          name: 'hang',
          description: 'never returns',
          parameters: { type: 'object', properties: {} },
          execute: () => new Promise(() => undefined),
        }),
      ],
    });
    const result = await agent.run({ prompt: 'go' });
    expect(result.text).toContain('passed toolTimeoutMs (100 ms)');
  });

  it('a provider request past turnTimeoutMs fails the run with TurnError', async () => {
    const p = await provider({ reply: () => ({ stall: true }) });
    const agent = createAgent({
      model: modelOf(p),
      credentials: { apiKey: 'k' },
      bounds: { turnTimeoutMs: 150 },
    });
    const error = await agent.run({ prompt: 'hi' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TurnError);
    expect((error as Error).message).toContain('turnTimeoutMs (150 ms)');
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
      'Expected `bounds.toolTimeoutMs`',
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
