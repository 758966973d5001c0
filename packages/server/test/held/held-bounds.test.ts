import { describe, expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../helpers.js';
import { openStream } from './sse.js';

describe('the per-user cap of held runs (runs.maxConcurrentPerUser)', () => {
  it('counts inline and streamed runs of one user together: over it, 429 scope user with Retry-After; other users and queued runs are not held back; a place frees when a run ends', async () => {
    const provider = await startProviderStandIn({
      reply: (r) => (lastUserText(r).includes('stall') ? { stall: true } : { text: 'ok' }),
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider, runs: { maxConcurrentPerUser: 2 } });
    const url = `${t.server.url}/api/client/v1/agents/echo/runs`;
    const ann = await t.token({ user: 'ann', role: 'member' });
    const bob = await t.token({ user: 'bob', role: 'member' });

    const inline = t.call('POST', '/agents/echo/runs', { input: 'stall 1' }, ann);
    const stream = await openStream(url, ann, { input: 'stall 2', stream: true });
    const streamed = (await stream.next())!.data.id as string;
    await until(() => provider.inFlight === 2, 'both held runs at the provider');

    for (const body of [{ input: 'x' }, { input: 'x', stream: true }]) {
      const over = await t.call('POST', '/agents/echo/runs', body, ann);
      expect(over.status).toBe(429);
      expect(over.retryAfter).toMatch(/^\d+$/);
      expect(over.body.error).toMatchObject({
        code: 'agent_run_concurrency_limit',
        scope: 'user',
        limit: 'max_concurrent_per_user',
        limit_value: 2,
        active: 2,
      });
    }
    // Another user of the same tenant, and a queued run of the same user, are not held runs.
    expect((await t.call('POST', '/agents/echo/runs', { input: 'bob' }, bob)).status).toBe(200);
    expect((await t.call('POST', '/agents/echo/runs', { input: 'later', wait: false }, ann)).status).toBe(
      202,
    );

    expect((await t.call('POST', `/agents/runs/${streamed}/cancel`, {}, ann)).body.status).toBe('canceled');
    expect((await stream.rest()).at(-1)!.event).toBe('run.canceled');
    expect((await t.call('POST', '/agents/echo/runs', { input: 'again' }, ann)).status).toBe(200);
    const running = (await t.call('GET', '/agents/runs?status=running')).body.data;
    await t.call('POST', `/agents/runs/${running[0].id}/cancel`);
    expect((await inline).body.status).toBe('canceled');
  });

  it('0 means no cap', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider, runs: { maxConcurrentPerUser: 0 } });
    const calls = Array.from({ length: 12 }, () => t.call('POST', '/agents/echo/runs', { input: 'stall' }));
    await until(() => provider.inFlight === 12, 'twelve held runs of one user at the provider');
    await t.server.close();
    for (const r of await Promise.all(calls)) expect(r.status).not.toBe(429);
  });
});

describe('run timeouts and per-run bounds', () => {
  it('an inline run past runs.timeoutMs answers 504 run_timeout with the run, which ended failed with error.type timeout', async () => {
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider, runs: { timeoutMs: 300 } });
    const r = await t.call('POST', '/agents/echo/runs', { input: 'slow' });
    expect(r.status).toBe(504);
    expect(r.body.error).toMatchObject({ type: 'run_timeout', code: 'run_timeout' });
    expect(r.body.error.run).toMatchObject({ status: 'failed', error: { type: 'timeout' } });
    expect((await t.statusOf(r.body.error.run.id)).error.type).toBe('timeout');
    await until(() => provider.inFlight === 0, 'the provider request aborted');
  });

  it("a client timeout_ms tightens the run timeout, and cannot loosen it: a larger value is lowered to the server's", async () => {
    const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider, runs: { timeoutMs: 400 } });
    const tighter = await t.call('POST', '/agents/echo/runs', { input: 'slow', config: { timeout_ms: 200 } });
    expect(tighter.status).toBe(504);
    const looser = await t.call('POST', '/agents/echo/runs', {
      input: 'slow',
      config: { timeout_ms: 3_600_000 },
    });
    expect(looser.status).toBe(504);
    // Removing it is not the client's call either.
    const removed = await t.call('POST', '/agents/echo/runs', {
      input: 'slow',
      config: { timeout_ms: null },
    });
    expect(removed.status).toBe(504);
    const rows = await t.server.store.db.query<{ config: unknown }>(
      'SELECT config FROM agent_runs ORDER BY seq',
    );
    expect(rows.rows.map((r) => r.config)).toEqual([
      { timeout_ms: 200, max_parallel_tool_calls: 10 },
      { timeout_ms: 400, max_parallel_tool_calls: 10 },
      { timeout_ms: 400, max_parallel_tool_calls: 10 },
    ]);
  });

  it("max_parallel_tool_calls: the server caps a turn's tools; a client can lower it and never raise it; tool_timeout_ms bounds one tool call", async () => {
    // One turn asks for six tool calls at once; then the answer.
    const provider = await startProviderStandIn({
      reply: (r) =>
        r.messages.some((m) => m.role === 'tool')
          ? {
              text: r.messages
                .filter((m) => m.role === 'tool')
                .map((m) => String(m.content))
                .join(','),
            }
          : { toolCalls: Array.from({ length: 6 }, (_, i) => ({ name: 'work', arguments: { n: i } })) },
    });
    afterThisTest(() => provider.close());
    let running = 0;
    let peak = 0;
    const waiting: (() => void)[] = [];
    let gateOpen = false;
    const openGate = () => {
      gateOpen = true;
      for (const resume of waiting.splice(0)) resume();
    };
    const t = await startTestServer({
      provider,
      runs: { maxParallelToolCalls: 3 },
      agents: (model) => ({
        worker: createAgent({
          model,
          credentials: { apiKey: 'k' },
          tools: [
            tool<{ n: number }>({
              name: 'work',
              description: 'Work',
              parameters: { type: 'object', properties: { n: { type: 'number' } }, required: ['n'] },
              execute: async ({ n }) => {
                running += 1;
                peak = Math.max(peak, running);
                // Calls stay in until the test has seen how many are in at once.
                if (!gateOpen) await new Promise<void>((resolve) => waiting.push(resolve));
                running -= 1;
                return `w${n}`;
              },
            }),
          ],
        }),
      }),
    });
    const runWith = async (config: object, expected: number) => {
      running = 0;
      peak = 0;
      gateOpen = false;
      const call = t.call('POST', '/agents/worker/runs', { input: 'go', config });
      // Held in their tools, exactly this many are in at once; one more would show in `peak`.
      await until(() => running === expected, `${expected} tools running`);
      openGate();
      const r = await call;
      expect(r.body.status).toBe('succeeded');
      expect(peak).toBe(expected);
    };
    await runWith({}, 3);
    await runWith({ max_parallel_tool_calls: 2 }, 2);
    await runWith({ max_parallel_tool_calls: 50 }, 3);

    // A tool that never returns, bounded by tool_timeout_ms: the model is told and answers.
    gateOpen = false;
    const bounded = await t.call('POST', '/agents/worker/runs', {
      input: 'go',
      config: { tool_timeout_ms: 200 },
    });
    expect(bounded.status).toBe(200);
    expect(bounded.body.status).toBe('succeeded');
    expect(bounded.body.output.text).toMatch(/time/i);
    openGate();
  });
});
