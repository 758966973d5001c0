import { describe, expect, it } from 'vitest';
import {
  ConcurrencyLeaseLostError,
  ConcurrencyTimeoutError,
  TurnError,
  createAgent,
  tool,
  type ConcurrencyLimiter,
} from 'sluice';
import { replies, toolThenAnswer } from '@sluice/testkit';
import { eventLog, until, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

describe('agent runs against the provider stand-in over HTTP', () => {
  it('answers a prompt, with usage and the conversation', async () => {
    const p = await f.provider();
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, instructions: 'Be brief.' });
    const result = await agent.run({ prompt: 'hello' });
    expect(result.text).toBe('Echo: hello');
    expect(result.usage.requests).toBe(1);
    expect(result.usage.totalTokens).toBeGreaterThan(0);
    expect(result.messages).toHaveLength(2);
    expect(p.requests[0]).toMatchObject({ apiKey: 'test-key', stream: true, done: true });
  });

  it('runs on the Anthropic messages protocol too, tool calls included', async () => {
    const p = await f.provider({
      reply: toolThenAnswer(() => [{ name: 'lookup', arguments: { q: 'tides' } }]),
    });
    const agent = createAgent({
      model: f.model(p, 'anthropic-messages'),
      credentials: { apiKey: 'anthropic-key' },
      instructions: 'Be brief.',
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
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
    const p = await f.provider({ reply: () => ({ text: 'a reply long enough to come in several chunks' }) });
    const agent = createAgent({ model: f.model(p), credentials: f.credentials });
    const s = agent.stream({ prompt: 'hi' });
    const deltas: string[] = [];
    for await (const delta of s) deltas.push(delta);
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.join('')).toBe('a reply long enough to come in several chunks');
    expect((await s.result).text).toBe(deltas.join(''));
  });

  it('a parent that calls a child through a tool runs under maxConcurrent: 1', async () => {
    const p = await f.provider({
      reply: (r) => {
        const isChild = r.messages.some((m) => m.role === 'system' && String(m.content).includes('child'));
        if (isChild) return { text: 'child says hi' };
        return toolThenAnswer(() => [{ name: 'ask_child', arguments: { question: 'hi?' } }])(r);
      },
    });
    const limiter = f.limiter();
    const log = eventLog();
    const child = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'You are the child.',
      clock: f.clock,
    });
    const parent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      instructions: 'You are the parent.',
      concurrency: { limiter },
      clock: f.clock,
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
    const result = await parent.run({ prompt: 'go', events: { onConcurrency: log.onConcurrency } });
    expect(result.text).toBe('Done: child says hi');
    expect(p.peakInFlight).toBe(1);
    // Three provider requests, each with its own slot; the child's carry the lineage.
    const acquired = log.of('acquired');
    expect(acquired).toHaveLength(3);
    const childEvent = acquired[1]!;
    expect(childEvent.parentRunId).toBe(result.runId);
    expect(childEvent.rootRunId).toBe(result.runId);
    expect(childEvent.runId).not.toBe(result.runId);
  });

  it('a budget spent waiting for a slot fails with ConcurrencyTimeoutError, and the provider is never called', async () => {
    const p = await f.provider();
    const limiter = f.limiter();
    const held = await limiter.acquire();
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
      events: { onConcurrency: log.onConcurrency },
    });
    const run = agent.run({ prompt: 'hi', timeoutMs: 150 }).catch((e: unknown) => e);
    await log.seen('wait-started');
    f.clock.advance(150);
    const error = await run;
    expect(error).toBeInstanceOf(ConcurrencyTimeoutError);
    expect(error).toMatchObject({ waitMs: 150, timeoutMs: 150, limiter: 'default', workload: 'default' });
    expect(log.types()).toEqual(['wait-started', 'timed-out']);
    expect(p.requests).toHaveLength(0);
    await limiter.release(held);
  });

  it('a retry after a 429 is a new request with a new slot, honouring retry-after', async () => {
    const p = await f.provider({ reply: replies({ status: 429, retryAfterSeconds: 0 }, { text: 'ok now' }) });
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
      retry: { baseDelayMs: 20 },
      events: { onConcurrency: log.onConcurrency },
    });
    // retry-after: 0 is a wait of none, so the retry needs no clock.
    const result = await agent.run({ prompt: 'hi' });
    expect(result.text).toBe('ok now');
    expect(result.usage.requests).toBe(2);
    expect(log.types()).toEqual([
      'wait-started',
      'acquired',
      // The provider said it is overloaded: the run's listeners hear it with the slot's release.
      'provider-throttled',
      'released',
      'wait-started',
      'acquired',
      'released',
    ]);
    expect(log.events[2]).toMatchObject({ status: 429, retryAfterMs: 0 });
    expect(log.events[3]).toMatchObject({ outcome: 'failed' });
    expect(new Set(log.of('acquired').map((e) => e.requestId)).size).toBe(2);
  });

  it('a connection dropped mid-stream is retried after a jittered backoff, as a new request with a new slot', async () => {
    const p = await f.provider({ reply: replies({ drop: 'mid-stream' }, { text: 'second time lucky' }) });
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
      retry: { baseDelayMs: 20 },
      events: { onConcurrency: log.onConcurrency },
    });
    const run = agent.run({ prompt: 'hi' });
    const backoff = await f.clock.timer();
    // Full jitter below baseDelayMs for the first retry.
    expect(backoff.ms).toBeGreaterThanOrEqual(0);
    expect(backoff.ms).toBeLessThan(20);
    f.clock.advance(backoff.ms);
    const result = await run;
    expect(result.text).toBe('second time lucky');
    expect(p.requests).toHaveLength(2);
    expect(log.of('released').map((e) => e.outcome)).toEqual(['failed', 'completed']);
  });

  it("a 429's retry-after header sets the wait before the retry, with no slot held meanwhile", async () => {
    const p = await f.provider({ reply: replies({ status: 429, retryAfterSeconds: 1 }, { text: 'ok' }) });
    const limiter = f.limiter();
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      retry: { baseDelayMs: 1 },
      concurrency: { limiter },
      clock: f.clock,
      events: { onConcurrency: log.onConcurrency },
    });
    const run = agent.run({ prompt: 'hi' });
    const wait = await f.clock.timer();
    // The provider's second, not the backoff (at most 1 ms), and no slot held meanwhile.
    expect(wait.ms).toBe(1000);
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
    expect(p.requests).toHaveLength(1);
    f.clock.advance(1000);
    expect((await run).text).toBe('ok');
    const starts = log.of('wait-started').map((e) => e.at);
    expect(starts[1]! - starts[0]!).toBe(1000);
  });

  it('a wait the provider names in its error message is honoured before the retry', async () => {
    const p = await f.provider({
      reply: replies(
        { status: 429, message: 'Rate limit reached. Please try again in 300ms.' },
        { text: 'ok' },
      ),
    });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      retry: { baseDelayMs: 1 },
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
    });
    const run = agent.run({ prompt: 'hi' });
    expect((await f.clock.timer()).ms).toBe(300);
    f.clock.advance(300);
    expect((await run).usage.requests).toBe(2);
  });

  it('credential fallback: the next key after an authentication failure, as a new request with a new slot', async () => {
    const p = await f.provider({
      reply: (r) => (r.apiKey === 'bad' ? { status: 401 } : { text: `hello from ${r.apiKey}` }),
    });
    const log = eventLog();
    const agent = createAgent({
      model: f.model(p),
      credentials: [{ apiKey: 'bad' }, { apiKey: 'good' }],
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
      events: { onConcurrency: log.onConcurrency },
    });
    const result = await agent.run({ prompt: 'hi' });
    expect(result.text).toBe('hello from good');
    expect(p.requests.map((r) => r.apiKey)).toEqual(['bad', 'good']);
    expect(log.of('acquired')).toHaveLength(2);
  });

  it('a provider error that is not transient fails the run with TurnError, its slot released', async () => {
    const p = await f.provider({ reply: () => ({ status: 400, message: 'bad request' }) });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter: f.limiter() },
      clock: f.clock,
    });
    const error = await agent.run({ prompt: 'hi' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TurnError);
    expect(error).toMatchObject({ status: 400, retryable: false, limiter: 'default', workload: 'default' });
    expect((error as Error).message).toBe('Provider request failed with HTTP 400: 400 bad request');
  });

  it('300 tool calls in one turn run 10 at a time', async () => {
    const p = await f.provider({
      reply: toolThenAnswer(
        () => Array.from({ length: 300 }, (_, i) => ({ name: 'work', arguments: { n: i } })),
        (results) => `finished ${results.length}`,
      ),
    });
    let running = 0;
    let peak = 0;
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
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
    const p = await f.provider({ reply: () => ({ stall: true }) });
    const limiter = f.limiter();
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
    });
    const controller = f.controller();
    const run = agent.run({ prompt: 'hi', signal: controller.signal }).catch((e: unknown) => e);
    await until(() => p.inFlight === 1, { message: 'the request to reach the stand-in' });
    const reason = new Error('user left');
    controller.abort(reason);
    expect(await run).toBe(reason);
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it('a lost lease aborts the request with ConcurrencyLeaseLostError', async () => {
    const p = await f.provider({ reply: () => ({ stall: true }) });
    const inner = f.limiter({ name: 'flaky', leaseTtlMs: 90 });
    // Renewal finds the lease gone, as after a partition.
    const limiter: ConcurrencyLimiter<'default'> = {
      name: inner.name,
      acquire: (r) => inner.acquire(r),
      renew: async () => undefined,
      release: (l) => inner.release(l),
      validateWorkload: (w) => inner.validateWorkload(w),
    };
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      concurrency: { limiter },
      clock: f.clock,
    });
    const run = agent.run({ prompt: 'hi' }).catch((e: unknown) => e);
    await until(() => p.inFlight === 1, { message: 'the request to reach the stand-in' });
    // The slot renews every third of its ttl: the first renewal finds the lease gone.
    f.clock.advance(30);
    const error = await run;
    expect(error).toBeInstanceOf(ConcurrencyLeaseLostError);
    expect(error).toMatchObject({ limiter: 'flaky', holdMs: 30 });
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true });
  });
});
