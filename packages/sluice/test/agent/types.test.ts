// Type-level checks for agents: `npm test` type-checks this file, so each `@ts-expect-error`
// fails the run if the line it marks ever compiles.
import { describe, expect, expectTypeOf, it } from 'vitest';
import { ConcurrencyConfigError, createAgent, createConcurrencyLimiter, type Agent } from 'sluice';

const model = {
  api: 'openai-completions' as const,
  provider: 'x',
  id: 'y',
  baseUrl: 'http://127.0.0.1:9/v1',
};
const credentials = { apiKey: 'k' };

describe('typed workloads through the agent', () => {
  it('an agent gets its workload names from its limiter', async () => {
    const claude = createConcurrencyLimiter({
      maxConcurrent: 8,
      workloads: { interactive: { reserved: 2 }, background: {} },
    });
    const agent = createAgent({
      model,
      credentials,
      concurrency: { limiter: claude, workload: 'background' },
    });
    expectTypeOf(agent).toEqualTypeOf<Agent<'interactive' | 'background'>>();
    const ok = () => agent.run({ prompt: 'p', concurrency: { workload: 'interactive' } });
    // @ts-expect-error not a workload of this limiter
    const typo = () => agent.run({ prompt: 'p', concurrency: { workload: 'batch' } });
    expectTypeOf(ok).returns.toBeObject();
    // The refusal the type states also holds at runtime, for JavaScript callers.
    await expect(Promise.resolve().then(typo)).rejects.toMatchObject({
      name: 'ConcurrencyConfigError',
      workload: 'batch',
    });
    expect(() =>
      // @ts-expect-error the agent's own workload is checked too (and at runtime)
      createAgent({ model, credentials, concurrency: { limiter: claude, workload: 'batch' } }),
    ).toThrow(ConcurrencyConfigError);
  });

  it('an agent without a limiter is Agent<never> and its runs cannot pick a workload', async () => {
    const agent = createAgent({ model, credentials });
    expectTypeOf(agent).toEqualTypeOf<Agent<never>>();
    // @ts-expect-error no workload to pick
    const run = () => agent.run({ prompt: 'p', concurrency: { workload: 'default' } });
    await expect(Promise.resolve().then(run)).rejects.toMatchObject({
      name: 'ConcurrencyConfigError',
      field: 'concurrency.workload',
    });
  });

  it('a limiter with several workloads and no default makes createAgent require one', () => {
    const limiter = createConcurrencyLimiter({ maxConcurrent: 2, workloads: { a: {}, b: {} } });
    expect(() => createAgent({ model, credentials, concurrency: { limiter } })).toThrow(
      ConcurrencyConfigError,
    );
    expect(() => createAgent({ model, credentials, concurrency: { limiter, workload: 'a' } })).not.toThrow();
  });
});
