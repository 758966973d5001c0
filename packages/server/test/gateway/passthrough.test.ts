import { expect, it } from 'vitest';
import { rawRequest, receivedText, startGatewayServer, UPSTREAM_KEY } from './harness.js';

// Item 1: the official SDKs, pointed at the gateway, get what the provider answers; the
// provider gets the request with the gateway's key and none of the caller's credentials.

it('the openai client: chat completions, responses, embeddings and models, streamed and not', async () => {
  const s = await startGatewayServer();
  const token = await s.token({ tenant: 'acme' });
  const client = s.openai(token);

  const chat = await client.chat.completions.create({
    model: 'gpt-x',
    messages: [{ role: 'user', content: 'hi' }],
  });
  expect(chat.choices[0]!.message.content).toBe('echo "hi"');
  expect(chat.usage).toMatchObject({ prompt_tokens: 11, completion_tokens: 7 });

  const chunks: string[] = [];
  const stream = await client.chat.completions.create({
    model: 'gpt-x',
    messages: [{ role: 'user', content: 'streamed' }],
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) chunks.push(chunk.choices[0]?.delta.content ?? '');
  expect(chunks.join('')).toBe('echo "streamed"');

  const response = await client.responses.create({ model: 'gpt-x', input: 'a response' });
  expect(response.output_text).toBe('echo "a response"');
  expect(response.usage).toMatchObject({ input_tokens: 11, output_tokens: 7 });

  const deltas: string[] = [];
  let completed = false;
  for await (const event of await client.responses.create({
    model: 'gpt-x',
    input: 'streamed response',
    stream: true,
  })) {
    if (event.type === 'response.output_text.delta') deltas.push(event.delta);
    if (event.type === 'response.completed') completed = true;
  }
  expect(deltas.join('')).toBe('echo "streamed response"');
  expect(completed).toBe(true);

  const embeddings = await client.embeddings.create({ model: 'emb', input: ['one', 'two'] });
  expect(embeddings.data).toHaveLength(2);
  expect(embeddings.usage.prompt_tokens).toBeGreaterThan(0);

  const models = await client.models.list();
  expect(models.data.map((m) => m.id)).toEqual(['stand-in-small', 'stand-in-large']);

  // What reached the provider: the paths under its /v1, the gateway's key, never the caller's token.
  expect(s.provider.requests.map((r) => `${r.method} ${r.path}`)).toEqual([
    'POST /v1/chat/completions',
    'POST /v1/chat/completions',
    'POST /v1/responses',
    'POST /v1/responses',
    'POST /v1/embeddings',
    'GET /v1/models',
  ]);
  for (const r of s.provider.requests) expect(r.headers.authorization).toBe(`Bearer ${UPSTREAM_KEY}`);
  expect(receivedText(s.provider)).not.toContain(token);
}, 240_000);

it('@anthropic-ai/sdk: messages streamed and not, and count_tokens, with x-api-key', async () => {
  const s = await startGatewayServer();
  const token = await s.token({ tenant: 'acme' });
  const client = s.anthropic(token);

  const message = await client.messages.create({
    model: 'claude-x',
    max_tokens: 100,
    messages: [{ role: 'user', content: 'hello claude' }],
  });
  expect(message.content).toEqual([{ type: 'text', text: 'echo "hello claude"' }]);
  expect(message.usage).toMatchObject({ input_tokens: 11, output_tokens: 7 });

  const streamed = client.messages.stream({
    model: 'claude-x',
    max_tokens: 100,
    messages: [{ role: 'user', content: 'stream it' }],
  });
  const texts: string[] = [];
  streamed.on('text', (t) => texts.push(t));
  const final = await streamed.finalMessage();
  expect(texts.join('')).toBe('echo "stream it"');
  expect(final.usage.output_tokens).toBe(7);

  const counted = await client.messages.countTokens({
    model: 'claude-x',
    messages: [{ role: 'user', content: 'count me' }],
  });
  expect(counted.input_tokens).toBeGreaterThan(0);

  expect(s.provider.requests.map((r) => `${r.method} ${r.path}`)).toEqual([
    'POST /v1/messages',
    'POST /v1/messages',
    'POST /v1/messages/count_tokens',
  ]);
  for (const r of s.provider.requests) {
    expect(r.headers['x-api-key']).toBe(UPSTREAM_KEY);
    expect(r.headers.authorization).toBeUndefined();
    // The SDK's own headers reach the provider.
    expect(r.headers['anthropic-version']).toBeDefined();
  }
  expect(receivedText(s.provider)).not.toContain(token);
}, 240_000);

it('hop-by-hop headers, cookies and the caller token stay here; the query goes as it came; the answer carries no upstream key', async () => {
  const s = await startGatewayServer();
  const token = await s.token({ tenant: 'acme' });
  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'q' }] });
  const answer = await rawRequest(s.server.url, {
    method: 'POST',
    path: '/api/client/v1/gateway/openai/chat/completions?api-version=2024-01&x=a%20b',
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      connection: 'keep-alive, x-private-hop',
      'x-private-hop': 'for this connection only',
      'keep-alive': 'timeout=5',
      te: 'trailers',
      'proxy-authorization': 'Basic c2VjcmV0OnNlY3JldA==',
      cookie: 'session=caller-cookie',
      'x-custom-provider-header': 'kept',
      'openai-organization': 'org-1',
    },
    body,
  });
  expect(answer.status).toBe(200);
  const [received] = s.provider.requests;
  expect(received!.path).toBe('/v1/chat/completions?api-version=2024-01&x=a%20b');
  expect(received!.headers).toMatchObject({
    authorization: `Bearer ${UPSTREAM_KEY}`,
    'x-custom-provider-header': 'kept',
    'openai-organization': 'org-1',
    'content-length': String(Buffer.byteLength(body)),
  });
  for (const name of ['x-private-hop', 'keep-alive', 'te', 'proxy-authorization', 'cookie', 'x-api-key'])
    expect(received!.headers, name).not.toHaveProperty(name);
  expect(receivedText(s.provider)).not.toContain(token);
  expect(JSON.stringify(answer)).not.toContain(UPSTREAM_KEY);
  expect(answer.headers['x-request-id']).toBeDefined();
}, 240_000);

it('upstream errors pass through with their status and body', async () => {
  const s = await startGatewayServer({
    standIn: { reply: () => ({ status: 400, message: 'the model refused this' }) },
  });
  const token = await s.token({ tenant: 'acme' });
  const error = await s
    .openai(token)
    .chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] })
    .then(
      () => undefined,
      (e: unknown) => e as { status: number; message: string; constructor: { name: string } },
    );
  expect(error).toMatchObject({ status: 400 });
  expect(error!.constructor.name).toBe('BadRequestError');
  expect(error!.message).toContain('the model refused this');
}, 240_000);
