import { afterEach, describe, expect, it } from 'vitest';
import {
  ConcurrencyLeaseLostError,
  ConcurrencyTimeoutError,
  TurnError,
  createAgent,
  createConcurrencyLimiter,
  tool,
  type ConcurrencyEvent,
  type ConcurrencyLimiter,
} from 'sluice';
import { replies, startProviderStandIn, toolThenAnswer, type ProviderStandIn } from '@sluice/testkit';

const standIns: ProviderStandIn[] = [];
async function provider(options: Parameters<typeof startProviderStandIn>[0] = {}) {
  const p = await startProviderStandIn(options);
  standIns.push(p);
  return p;
}
afterEach(async () => {
  for (const p of standIns.splice(0)) await p.close();
});

const model = (p: ProviderStandIn) => ({
  api: 'openai-completions' as const,
  provider: 'stand-in',
  id: 'stand-in-1',
  baseUrl: p.url,
});
const credentials = { apiKey: 'test-key' };

describe('agent runs against the provider stand-in over HTTP', () => {
  it('answers a prompt, with usage and the conversation', async () => {
    const p = await provider();
    const agent = createAgent({ model: model(p), credentials, instructions: 'Be brief.' });
    const result = await agent.run({ prompt: 'hello' });
    expect(result.text).toBe('Echo: hello');
    expect(result.usage.requests).toBe(1);
    expect(result.usage.totalTokens).toBeGreaterThan(0);
    expect(result.messages).toHaveLength(2);
    expect(p.requests[0]).toMatchObject({ apiKey: 'test-key', stream: true, done: true });
  });

  it('runs on the Anthropic messages protocol too, tool calls included', async () => {
    const p = await provider({
      reply: toolThenAnswer(() => [{ name: 'lookup', arguments: { q: 'tides' } }]),
    });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const agent = createAgent({
      model: {
        api: 'anthropic-messages',
        provider: 'stand-in',
        id: 'claude-stand-in',
        baseUrl: p.anthropicUrl,
      },
      credentials: { apiKey: 'anthropic-key' },
      instructions: 'Be brief.',
      concurrency: { limiter },
      tools: [
        tool<{ q: string }>({
          name: 'lookup',
          description: 'Look something up',
          parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
          execute: ({ q }) => `high tide for ${q}`,
        }),
      ],
    });
    const result = await agent.run({ prompt: 'when?' });
    expect(result.text).toBe('Done: high tide for tides');
    expect(p.requests.map((r) => [r.apiKey, r.done])).toEqual([
      ['anthropic-key', true],
      ['anthropic-key', true],
    ]);
    expect(p.peakInFlight).toBe(1);
  });

  it('stream() gives the text as it arrives, and the same result as run()', async () => {
    const p = await provider({ reply: () => ({ text: 'a reply long enough to come in several chunks' }) });
    const agent = createAgent({ model: model(p), credentials });
    const s = agent.stream({ prompt: 'hi' });
    const deltas: string[] = [];
    for await (const delta of s) deltas.push(delta);
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.join('')).toBe('a reply long enough to come in several chunks');
    expect((await s.result).text).toBe(deltas.join(''));
  });

  it('a parent that calls a child through a tool runs under maxConcurrent: 1', async () => {
    const p = await provider({
      reply: (r) => {
        const isChild = r.messages.some((m) => m.role === 'system' && String(m.content).includes('child'));
        if (isChild) return { text: 'child says hi' };
        return toolThenAnswer(() => [{ name: 'ask_child', arguments: { question: 'hi?' } }])(r);
      },
    });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const events: ConcurrencyEvent[] = [];
    const child = createAgent({ model: model(p), credentials, instructions: 'You are the child.' });
    const parent = createAgent({
      model: model(p),
      credentials,
      instructions: 'You are the parent.',
      concurrency: { limiter },
      tools: [
        tool<{ question: string }>({
          name: 'ask_child',
          description: 'Ask the child agent',
          parameters: {
            type: 'object',
            properties: { question: { type: 'string' } },
            required: ['question'],
          },
          execute: async ({ question }) => (await child.run({ prompt: question })).text,
        }),
      ],
    });
    const result = await parent.run({ prompt: 'go', events: { onConcurrency: (e) => events.push(e) } });
    expect(result.text).toBe('Done: child says hi');
    expect(p.peakInFlight).toBe(1);
    // Three provider requests, each with its own slot; the child's carry the lineage.
    const acquired = events.filter((e) => e.type === 'acquired');
    expect(acquired).toHaveLength(3);
    const childEvent = acquired[1]!;
    expect(childEvent.parentRunId).toBe(result.runId);
    expect(childEvent.rootRunId).toBe(result.runId);
    expect(childEvent.runId).not.toBe(result.runId);
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('a budget spent waiting for a slot fails with ConcurrencyTimeoutError, and the provider is never called', async () => {
    const p = await provider();
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const held = await limiter.acquire();
    const agent = createAgent({ model: model(p), credentials, concurrency: { limiter } });
    const error = await agent.run({ prompt: 'hi', timeoutMs: 150 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(p.requests).toHaveLength(0);
    await limiter.release(held);
  });

  it('a retry after a 429 is a new request with a new slot, honouring retry-after', async () => {
    const p = await provider({ reply: replies({ status: 429, retryAfterSeconds: 0 }, { text: 'ok now' }) });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const events: ConcurrencyEvent[] = [];
    const agent = createAgent({
      model: model(p),
      credentials,
      concurrency: { limiter },
      retry: { baseDelayMs: 20 },
      events: { onConcurrency: (e) => events.push(e) },
    });
    const result = await agent.run({ prompt: 'hi' });
    expect(result.text).toBe('ok now');
    expect(result.usage.requests).toBe(2);
    expect(events.map((e) => e.type)).toEqual([
      'wait-started',
      'acquired',
      'released',
      'wait-started',
      'acquired',
      'released',
    ]);
    expect(events[2]).toMatchObject({ outcome: 'failed' });
    expect(new Set(events.filter((e) => e.type === 'acquired').map((e) => e.requestId)).size).toBe(2);
  });

  it('a connection dropped mid-stream is retried as a new request with a new slot', async () => {
    const p = await provider({ reply: replies({ drop: 'mid-stream' }, { text: 'second time lucky' }) });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const events: ConcurrencyEvent[] = [];
    const agent = createAgent({
      model: model(p),
      credentials,
      concurrency: { limiter },
      retry: { baseDelayMs: 20 },
      events: { onConcurrency: (e) => events.push(e) },
    });
    const result = await agent.run({ prompt: 'hi' });
    expect(result.text).toBe('second time lucky');
    expect(p.requests).toHaveLength(2);
    expect(
      events.filter((e) => e.type === 'released').map((e) => (e as { outcome: string }).outcome),
    ).toEqual(['failed', 'completed']);
  });

  it("a 429's retry-after header sets the wait before the retry, with no slot held meanwhile", async () => {
    const p = await provider({ reply: replies({ status: 429, retryAfterSeconds: 1 }, { text: 'ok' }) });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const events: ConcurrencyEvent[] = [];
    const agent = createAgent({
      model: model(p),
      credentials,
      retry: { baseDelayMs: 1 },
      concurrency: { limiter },
      events: {
        onConcurrency: (e) => {
          events.push(e);
          // Between the failed attempt and the retry, the slot is free.
          if (e.type === 'released') expect(limiter.stats().active).toBe(0);
        },
      },
    });
    await agent.run({ prompt: 'hi' });
    const starts = events.filter((e) => e.type === 'wait-started').map((e) => e.at);
    expect(starts).toHaveLength(2);
    // Not before the second the provider asked for: the backoff alone would be at most 1 ms.
    expect(starts[1]! - starts[0]!).toBeGreaterThanOrEqual(1000);
  });

  it('a wait the provider names in its error message is honoured before the retry', async () => {
    const p = await provider({
      reply: replies(
        { status: 429, message: 'Rate limit reached. Please try again in 300ms.' },
        { text: 'ok' },
      ),
    });
    const times: number[] = [];
    const agent = createAgent({
      model: model(p),
      credentials,
      retry: { baseDelayMs: 1 },
      concurrency: { limiter: createConcurrencyLimiter({ maxConcurrent: 1 }) },
      events: { onConcurrency: (e) => e.type === 'wait-started' && times.push(e.at) },
    });
    await agent.run({ prompt: 'hi' });
    expect(times).toHaveLength(2);
    // Not before the named wait: the backoff alone would be at most 1 ms.
    expect(times[1]! - times[0]!).toBeGreaterThanOrEqual(300);
  });

  it('credential fallback: the next key after an authentication failure, as a new request with a new slot', async () => {
    const p = await provider({
      reply: (r) => (r.apiKey === 'bad' ? { status: 401 } : { text: `hello from ${r.apiKey}` }),
    });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const events: ConcurrencyEvent[] = [];
    const agent = createAgent({
      model: model(p),
      credentials: [{ apiKey: 'bad' }, { apiKey: 'good' }],
      concurrency: { limiter },
      events: { onConcurrency: (e) => events.push(e) },
    });
    const result = await agent.run({ prompt: 'hi' });
    expect(result.text).toBe('hello from good');
    expect(p.requests.map((r) => r.apiKey)).toEqual(['bad', 'good']);
    expect(events.filter((e) => e.type === 'acquired')).toHaveLength(2);
  });

  it('a provider error that is not transient fails the run with TurnError, its slot released', async () => {
    const p = await provider({ reply: () => ({ status: 400, message: 'bad request' }) });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const agent = createAgent({ model: model(p), credentials, concurrency: { limiter } });
    const error = await agent.run({ prompt: 'hi' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TurnError);
    expect(error).toMatchObject({ status: 400, retryable: false, limiter: 'default', workload: 'default' });
    expect(limiter.stats().active).toBe(0);
  });

  it('300 tool calls in one turn run 10 at a time', async () => {
    const p = await provider({
      reply: toolThenAnswer(
        () => Array.from({ length: 300 }, (_, i) => ({ name: 'work', arguments: { n: i } })),
        (results) => `finished ${results.length}`,
      ),
    });
    let running = 0;
    let peak = 0;
    const agent = createAgent({
      model: model(p),
      credentials,
      tools: [
        tool<{ n: number }>({
          name: 'work',
          description: 'does work',
          parameters: { type: 'object', properties: { n: { type: 'number' } }, required: ['n'] },
          execute: async ({ n }) => {
            running++;
            peak = Math.max(peak, running);
            await new Promise((r) => setImmediate(r));
            running--;
            return n;
          },
        }),
      ],
    });
    const result = await agent.run({ prompt: 'go' });
    expect(result.text).toBe('finished 300');
    expect(peak).toBe(10);
  });

  it('cancellation during a stream aborts the request at the provider and gives the slot back', async () => {
    const p = await provider({ reply: () => ({ stall: true }) });
    const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
    const agent = createAgent({ model: model(p), credentials, concurrency: { limiter } });
    const controller = new AbortController();
    const run = agent.run({ prompt: 'hi', signal: controller.signal }).catch((e: unknown) => e);
    while (p.requests.length === 0 || limiter.stats().active === 0)
      await new Promise((r) => setTimeout(r, 5));
    const reason = new Error('user left');
    controller.abort(reason);
    expect(await run).toBe(reason);
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('a lost lease aborts the request with ConcurrencyLeaseLostError', async () => {
    const p = await provider({ reply: () => ({ stall: true }) });
    const inner = createConcurrencyLimiter({ name: 'flaky', maxConcurrent: 1, leaseTtlMs: 90 });
    // Renewal finds the lease gone, as after a partition.
    const limiter: ConcurrencyLimiter<'default'> = {
      name: inner.name,
      acquire: (r) => inner.acquire(r),
      renew: async () => undefined,
      release: (l) => inner.release(l),
      validateWorkload: (w) => inner.validateWorkload(w),
    };
    const agent = createAgent({ model: model(p), credentials, concurrency: { limiter } });
    const error = await agent.run({ prompt: 'hi' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConcurrencyLeaseLostError);
    expect(error).toMatchObject({ limiter: 'flaky' });
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
  });
});
