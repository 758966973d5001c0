import { describe, expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, type Reply } from '@sluice/testkit';
import { afterThisTest, startTestServer } from '../helpers.js';
import { openStream } from '../held/sse.js';

/**
 * DESIGN.md: a stream's `message.delta` texts "add up to the answer" (the run's `output.text`).
 * Deltas are forwarded from every provider attempt and every turn of the run, so anything the
 * run does not keep as its answer still reaches the client, and is never taken back.
 */
describe('review10: streamed deltas add up to the answer', () => {
  it("a provider stream cut in the middle and retried: the cut attempt's text is not part of the deltas", async () => {
    let calls = 0;
    const provider = await startProviderStandIn({
      reply: (): Reply => (++calls === 1 ? { drop: 'mid-stream' } : { text: 'the real answer' }),
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({ provider });
    const stream = await openStream(`${t.server.url}/api/client/v1/agents/echo/runs`, t.admin, {
      input: 'hello',
      stream: true,
    });
    const events = await stream.rest();
    const last = events.at(-1)!;
    expect(last.event).toBe('run.completed');
    // The run retried and succeeded with the second attempt's text.
    expect(provider.requests).toHaveLength(2);
    expect(last.data.output).toEqual({ text: 'the real answer' });
    const deltas = events
      .filter((e) => e.event === 'message.delta')
      .map((e) => e.data.text as string)
      .join('');
    // Fails: the deltas are 'This answer is cut' + 'the real answer'.
    expect(deltas).toBe(last.data.output.text);
  });

  it('text the model sends before a tool call is streamed, but is not the answer', async () => {
    const provider = await startProviderStandIn({
      reply: (r): Reply =>
        r.messages.some((m) => m.role === 'tool')
          ? { text: 'found it' }
          : { text: 'Let me look. ', toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }] },
    });
    afterThisTest(() => provider.close());
    const t = await startTestServer({
      provider,
      agents: (model) => ({
        researcher: createAgent({
          model,
          credentials: { apiKey: 'k' },
          tools: [
            tool<{ q: string }>({
              name: 'lookup',
              description: 'Look something up',
              parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
              execute: async ({ q }) => `result-${q}`,
            }),
          ],
        }),
      }),
    });
    const stream = await openStream(`${t.server.url}/api/client/v1/agents/researcher/runs`, t.admin, {
      input: 'look',
      stream: true,
    });
    const events = await stream.rest();
    const last = events.at(-1)!;
    expect(last.event).toBe('run.completed');
    expect(last.data.output).toEqual({ text: 'found it' });
    const deltas = events
      .filter((e) => e.event === 'message.delta')
      .map((e) => e.data.text as string)
      .join('');
    // Fails: 'Let me look. found it'.
    expect(deltas).toBe(last.data.output.text);
  });
});
