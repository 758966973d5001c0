import { expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, startTestServer, until } from '../packages/server/test/helpers.js';
import { main } from './openai-client.js';

/**
 * The agents of `npm start`'s demo (a writer that asks a researcher through a tool), on a
 * stand-in scripted as the demo's is, without its random latency, and holding any request
 * about something "in depth" until it is cancelled: the example's cancel then always finds
 * its response still running.
 */
async function demoLikeServer() {
  const provider = await startProviderStandIn({
    reply: (r) => {
      const system = String(r.messages.find((m) => m.role === 'system')?.content ?? '');
      const question = lastUserText(r);
      if (question.includes('in depth')) return { stall: true };
      const usage = { input: 20, output: 5 };
      if (system.startsWith('You are a researcher')) return { text: `A fact about ${question}.`, usage };
      const facts = r.messages.filter((m) => m.role === 'tool');
      if (facts.length === 0) return { toolCalls: [{ name: 'research', arguments: { topic: question } }] };
      return { text: `Report: ${facts.map((f) => String(f.content)).join(' ')}`, usage };
    },
  });
  afterThisTest(() => provider.close());
  return startTestServer({
    provider,
    agents: (model) => {
      const credentials = { apiKey: 'demo' };
      const researcher = createAgent({
        model,
        credentials,
        instructions: 'You are a researcher. Give one fact.',
      });
      const writer = createAgent({
        model,
        credentials,
        instructions: 'You are a writer. Ask the researcher, then write a short report.',
        tools: [
          tool<{ topic: string }>({
            name: 'research',
            description: 'Ask the researcher about a topic',
            parameters: { type: 'object', properties: { topic: { type: 'string' } }, required: ['topic'] },
            execute: async ({ topic }) => (await researcher.run({ prompt: topic })).text,
          }),
        ],
      });
      return { writer, researcher };
    },
  });
}

it('the openai-client example runs against a real server with the official client', async () => {
  const t = await demoLikeServer();
  const printed: string[] = [];
  const result = await main({
    url: t.server.url,
    token: await t.token({ role: 'member' }),
    write: (text) => printed.push(text),
    pollMs: 20,
  });

  expect(result.first).toMatchObject({ status: 'completed', output_text: 'Report: A fact about tides.' });
  const usage = result.first.usage!;
  expect(usage.input_tokens).toBeGreaterThan(0);
  expect(usage.total_tokens).toBe(usage.input_tokens + usage.output_tokens);

  const { deltas, final } = result.streamed;
  expect(final).toMatchObject({ status: 'completed', output_text: 'Report: A fact about lighthouses.' });
  expect(deltas.length).toBeGreaterThan(1);
  expect(deltas.join('')).toBe(final.output_text);

  // The follow-up's run is on the same thread as the first response's run.
  expect(result.followUp).toMatchObject({
    status: 'completed',
    previous_response_id: result.first.id,
    output_text: 'Report: A fact about the moon.',
  });
  const [first, followUp] = await Promise.all([t.statusOf(result.first.id), t.statusOf(result.followUp.id)]);
  expect(first.thread_id).toMatch(/^thr_/);
  expect(followUp.thread_id).toBe(first.thread_id);
  const thread = (await t.call('GET', `/threads/${first.thread_id}/messages`)).body.data as {
    role: string;
    content: unknown;
  }[];
  expect(thread.map((m) => [m.role, m.content])).toEqual([
    ['user', 'tides'],
    ['assistant', 'Report: A fact about tides.'],
    ['user', 'the moon'],
    ['assistant', 'Report: A fact about the moon.'],
  ]);

  // Flex: answered at once as queued, then completed, as a deferred-class run.
  expect(result.flex.created).toMatchObject({ status: 'queued', background: true, service_tier: 'flex' });
  expect(result.flex.final).toMatchObject({
    status: 'completed',
    service_tier: 'flex',
    output_text: 'A fact about coral reefs.',
  });
  expect(await t.statusOf(result.flex.created.id)).toMatchObject({ class: 'deferred', status: 'succeeded' });

  expect(result.cancelled).toMatchObject({ status: 'cancelled', background: true });
  expect(await t.statusOf(result.cancelled.id)).toMatchObject({ status: 'canceled' });

  expect(result.chat.object).toBe('chat.completion');
  expect(result.chat.choices[0]).toMatchObject({
    finish_reason: 'stop',
    message: { role: 'assistant', content: 'A fact about volcanoes.' },
  });

  const output = printed.join('');
  expect(output).toContain(`"Report: A fact about tides."`);
  expect(output).toContain(`both runs are on thread ${first.thread_id}`);
  expect(output).toContain('(run class: deferred)');
  expect(output).toContain('queued -> cancelled');
  // The cancel reached the provider: the held request was aborted.
  await until(() => t.provider.inFlight === 0, 'the cancelled request aborted at the provider');
});
