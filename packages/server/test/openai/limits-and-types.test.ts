import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startTestServer, until } from '../helpers.js';

describe('the text limit counted over instructions and input', () => {
  it('a request whose `instructions` take it over the text limit is refused naming `instructions`, not the one-character `input`', async () => {
    const t = await startTestServer();
    const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
    const refused = await client.responses
      .create({ model: 'agent:echo', instructions: 'i'.repeat(1_000_000), input: 'x' })
      .catch((error: unknown) => error as InstanceType<typeof OpenAI.APIError>);
    expect(refused).toMatchObject({ status: 413, code: 'request_too_large' });
    // Fails: param 'input', message "`input` has 1000001 characters of text in all; the limit
    // is 1000000": routes.ts folds instructions into the input before checkInput(input, 'input').
    expect(refused).toMatchObject({ param: 'instructions' });
  });
});

describe("values the client's types do not allow", () => {
  it('a queued response has no `usage: null` or `user: null` (the client types them as an object and a string, or absent)', async () => {
    const t = await startTestServer();
    const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
    const queued = await client.responses.create({ model: 'agent:echo', input: 'stall', background: true });
    const seen = { usage: queued.usage as unknown, user: queued.user as unknown };
    await client.responses.cancel(queued.id);
    await until(() => t.provider.inFlight === 0, 'the run stopped');
    // Fails: { usage: null, user: null } (render.ts toResponse). `Response.usage?: ResponseUsage`
    // and `Response.user?: string` in openai 6.49, so typed code that tests `!== undefined`
    // reads a property of null.
    expect([seen.usage, seen.user]).not.toContain(null);
  });
});
