import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startTestServer } from '../helpers.js';

/**
 * What the runs API refuses as input (an empty message: `content: ''` or `content: []`, see
 * messageSchema in http/schemas.ts) the OpenAI endpoints take (partsOrText in
 * openai/schemas.ts has no minLength / minItems): a run is admitted, counted against the
 * tenant's caps and quota, and sent to the provider with an empty user message, which real
 * providers refuse (Anthropic: "text content blocks must be non-empty").
 */
describe('empty messages through the OpenAI endpoints', () => {
  const cases = [
    ['/responses', { model: 'agent:echo', input: [{ role: 'user', content: '' }] }, 'input.0.content'],
    ['/responses', { model: 'agent:echo', input: [{ role: 'user', content: [] }] }, 'input.0.content'],
    [
      '/chat/completions',
      { model: 'agent:echo', messages: [{ role: 'user', content: '' }] },
      'messages.0.content',
    ],
    [
      '/chat/completions',
      { model: 'agent:echo', messages: [{ role: 'user', content: [] }] },
      'messages.0.content',
    ],
  ] as const;

  it('the runs API refuses an empty message (the rule the OpenAI endpoints should share)', async () => {
    const t = await startTestServer();
    const r = await t.call('POST', '/agents/echo/runs', { messages: [{ role: 'user', content: '' }] });
    expect(r.status).toBe(400);
  });

  it.each(cases)(
    'POST %s with an empty message is 400 naming the content, and makes no run',
    async (path, body, param) => {
      const t = await startTestServer();
      const r = await t.call('POST', path, body);
      // Fails: 200, a completed run on an empty user message.
      expect({ status: r.status, param: r.body.error?.param }).toEqual({ status: 400, param });
      expect((await t.call('GET', '/agents/runs')).body.data).toHaveLength(0);
    },
  );
});

describe('a text part without its text', () => {
  it('is 400 naming the missing `text`, not a message that the part type is not understood', async () => {
    const t = await startTestServer();
    const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
    const refused = await client.responses
      .create({ model: 'agent:echo', input: [{ role: 'user', content: [{ type: 'input_text' } as never] }] })
      .catch((error: unknown) => error as InstanceType<typeof OpenAI.BadRequestError>);
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
    // Fails: param 'input.0.content.0.type', message "`input.0.content.0` is a `input_text` part;
    // only input_text and output_text parts are understood" (input.ts textParts: one message
    // for a wrong type and for a missing text).
    expect(refused).toMatchObject({ param: 'input.0.content.0.text' });
  });
});
