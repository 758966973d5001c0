import { describe, expect, it } from 'vitest';
import { ConcurrencyConfigError, createAgent, tool, type ConcurrencyLimiter } from 'sluice';
import { toolThenAnswer } from '@sluice/testkit';
import { useAgentFixture } from './fixture.js';

const f = useAgentFixture();

/** The in-memory limiter, with a log of the key of every acquire. */
function keyLog(inner: ConcurrencyLimiter<'default'>) {
  const keys: (string | undefined)[] = [];
  const limiter: ConcurrencyLimiter<'default'> = {
    name: inner.name,
    acquire: (request) => (keys.push(request?.key), inner.acquire(request)),
    renew: (lease) => inner.renew(lease),
    release: (lease) => inner.release(lease),
    validateWorkload: (w) => inner.validateWorkload!(w),
  };
  return { limiter, keys };
}

describe('run({ concurrency: { key } })', () => {
  it('gives every slot request of the run its key; a child run keeps it unless it sets its own', async () => {
    const p = await f.provider({
      reply: (r) => {
        const system = r.messages.find((m) => m.role === 'system');
        if (String(system?.content).includes('child')) return { text: 'child says hi' };
        return toolThenAnswer(() => [
          { name: 'ask', arguments: { own: false } },
          { name: 'ask', arguments: { own: true } },
        ])(r);
      },
    });
    const { limiter, keys } = keyLog(f.limiter({ maxConcurrent: 2 }));
    const child = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'child',
      clock: f.clock,
    });
    const parent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'parent',
      concurrency: { limiter },
      clock: f.clock,
      tools: [
        tool<{ own: boolean }>({
          name: 'ask',
          description: 'Ask the child',
          parameters: { type: 'object', properties: { own: { type: 'boolean' } }, required: ['own'] },
          execute: async ({ own }) =>
            (await child.run({ prompt: 'hi', concurrency: own ? { key: 'tenant-b' } : undefined })).text,
        }),
      ],
    });
    await parent.run({ prompt: 'go', concurrency: { key: 'tenant-a' } });
    // Parent's first request, the two children (in either order), the parent's answer.
    expect(keys).toHaveLength(4);
    expect(keys[0]).toBe('tenant-a');
    expect(keys[3]).toBe('tenant-a');
    expect([...keys.slice(1, 3)].sort()).toEqual(['tenant-a', 'tenant-b']);
  });

  it('refuses a key that is not a string of 1 to 256 characters before any request is sent', async () => {
    const p = await f.provider({ reply: () => ({ text: 'never' }) });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
    });
    for (const key of ['', 'k'.repeat(257)]) {
      const error = await agent.run({ prompt: 'p', concurrency: { key } }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ConcurrencyConfigError);
      expect(error).toMatchObject({ field: 'key', value: key });
      expect((error as Error).message).toContain('Expected `key` to be a string of 1 to 256 characters');
    }
    expect(p.requests).toHaveLength(0);
  });
});
