// A caller of the OpenAI endpoints waiting on a run its server interrupted (a SIGTERM drain that
// ran out of time) gets 503 agent_run_interrupted, as a caller of the runs API does (review row
// R58b); streamed, the stream ends with the error the route uses for errors. With the official
// openai client over a real socket.
import OpenAI, { APIError } from 'openai';
import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { ownStandIn, startTestServer, until } from '../helpers.js';

/** What a call raised: its status and error code, or `answered` when it raised nothing. */
async function raised(call: () => Promise<unknown>): Promise<{ status: number | undefined; code: unknown }> {
  try {
    await call();
  } catch (error) {
    if (!(error instanceof APIError)) throw error;
    return {
      status: error.status,
      code: (error.error as { code?: unknown } | undefined)?.code ?? error.code,
    };
  }
  return { status: 200, code: 'answered' };
}

/** Reads a stream to its end into `events`, as a client does; it raises what the stream ends with. */
async function drained(stream: AsyncIterable<unknown>, events: unknown[] = []): Promise<unknown[]> {
  for await (const event of stream) events.push(event);
  return events;
}

it('Responses and Chat Completions, streamed or not: a run interrupted by the drain answers 503 agent_run_interrupted', async () => {
  const provider = ownStandIn(await startProviderStandIn({ reply: () => ({ stall: true }) }));
  const t = await startTestServer({ provider, settings: { drainTimeoutMs: 500, syncTimeoutMs: 60_000 } });
  const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
  const model = 'agent:echo';

  const streamedResponse: unknown[] = [];
  const calls = {
    response: raised(() => client.responses.create({ model, input: 'one' })),
    streamedResponse: raised(async () => {
      await drained(await client.responses.create({ model, input: 'three', stream: true }), streamedResponse);
    }),
    chat: raised(() =>
      client.chat.completions.create({ model, messages: [{ role: 'user', content: 'four' }] }),
    ),
    streamedChat: raised(async () =>
      drained(
        await client.chat.completions.create({
          model,
          messages: [{ role: 'user', content: 'five' }],
          stream: true,
        }),
      ),
    ),
  };
  await until(() => provider.inFlight === 4, 'every run at the provider');
  const interrupted = await t.server.drain();
  expect(interrupted).toHaveLength(4);

  const answers = Object.fromEntries(
    await Promise.all(Object.entries(calls).map(async ([name, call]) => [name, await call] as const)),
  );
  expect(answers).toEqual({
    response: { status: 503, code: 'agent_run_interrupted' },
    chat: { status: 503, code: 'agent_run_interrupted' },
    // A stream has sent its 200 already: its last event is the error, which the client raises.
    streamedResponse: { status: undefined, code: 'agent_run_interrupted' },
    streamedChat: { status: undefined, code: 'agent_run_interrupted' },
  });
  // The Responses stream ended with the API's own `error` event, not `response.incomplete`.
  expect(streamedResponse.map((e) => (e as { type: string }).type)).toEqual([
    'response.created',
    'response.in_progress',
  ]);
}, 60_000);
