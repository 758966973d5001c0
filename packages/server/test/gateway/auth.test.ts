import { Writable } from 'node:stream';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { expect, it } from 'vitest';
import { rawRequest, receivedText, startGatewayServer, UPSTREAM_KEY } from './harness.js';

// Item 3: a Sluice token (Bearer or x-api-key) lets a tenant in; without one, or to a gateway
// it may not use, the answer is in the API's own error shape, and the provider sees nothing.

const chat = (client: OpenAI) =>
  client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'secret prompt text' }] });
const message = (client: Anthropic) =>
  client.messages.create({
    model: 'c',
    max_tokens: 5,
    messages: [{ role: 'user', content: 'secret prompt text' }],
  });
const caught = <T>(p: Promise<T>) =>
  p.then(
    () => undefined,
    (e: unknown) => e as Error & { status: number; error: unknown },
  );

it('401 without a token or with a bad one, in each API shape; 403 for a gateway the tenant may not use, or a read token; 404 for an unknown gateway', async () => {
  const lines: string[] = [];
  const logger = {
    level: 'info',
    stream: new Writable({
      write(chunk: Buffer, _e, done) {
        lines.push(chunk.toString());
        done();
      },
    }),
  };
  const s = await startGatewayServer({ tenants: { limited: { gateways: ['claude'] } }, logger });
  const acme = await s.token({ tenant: 'acme' });

  const noToken = await rawRequest(s.server.url, {
    method: 'POST',
    path: '/api/client/v1/gateway/openai/chat/completions',
    headers: { 'content-type': 'application/json' },
    body: '{}',
  });
  expect(noToken.status).toBe(401);
  expect(JSON.parse(noToken.body)).toMatchObject({ error: { type: 'authentication_required', param: null } });
  const noKey = await rawRequest(s.server.url, {
    method: 'POST',
    path: '/api/client/v1/gateway/claude/v1/messages',
    headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: '{}',
  });
  expect(noKey.status).toBe(401);
  expect(JSON.parse(noKey.body)).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
  const bad = await caught(chat(s.openai('sk_not_a_real_token_at_all_0000000000')));
  expect(bad).toBeInstanceOf(OpenAI.AuthenticationError);
  expect(bad!.error).toMatchObject({
    type: 'authentication_required',
    code: 'authentication_required',
    param: null,
  });

  const badClaude = await caught(message(s.anthropic('not-a-token')));
  expect(badClaude).toBeInstanceOf(Anthropic.AuthenticationError);
  expect(badClaude!.error).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });

  const limited = await s.token({ tenant: 'limited' });
  expect(await caught(chat(s.openai(limited)))).toBeInstanceOf(OpenAI.PermissionDeniedError);
  expect((await message(s.anthropic(limited))).content).toHaveLength(1);
  const reader = await s.token({ tenant: 'acme', role: 'read' });
  const readOnly = await caught(message(s.anthropic(reader)));
  expect(readOnly).toBeInstanceOf(Anthropic.PermissionDeniedError);
  expect(readOnly!.error).toMatchObject({ type: 'error', error: { type: 'permission_error' } });

  expect(await caught(chat(s.openai(acme, 'nope')))).toBeInstanceOf(OpenAI.NotFoundError);
  expect(await caught(chat(s.openai(acme, '__proto__')))).toBeInstanceOf(OpenAI.NotFoundError);
  expect(await caught(chat(s.openai(acme, 'constructor')))).toBeInstanceOf(OpenAI.NotFoundError);

  // An OpenAI client's token as x-api-key works too, and Bearer on the Anthropic gateway.
  const viaKey = await rawRequest(s.server.url, {
    method: 'POST',
    path: '/api/client/v1/gateway/openai/chat/completions',
    headers: { 'x-api-key': acme, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'k' }] }),
  });
  expect(viaKey.status).toBe(200);

  // Only the two good calls reached the provider, with the gateway's key and not the tenant's.
  expect(s.provider.requests).toHaveLength(2);
  const seen = receivedText(s.provider);
  for (const secret of [acme, limited]) expect(seen).not.toContain(secret);

  // Each request has a log line of its id, gateway and status, without the prompt or any key.
  const gatewayLines = lines.filter((l) => l.includes('"gateway request"'));
  expect(gatewayLines).toHaveLength(2);
  expect(JSON.parse(gatewayLines[0]!)).toMatchObject({ gateway: 'claude', tenant: 'limited', status: 200 });
  expect(JSON.parse(gatewayLines[0]!).reqId).toEqual(expect.any(String));
  const all = lines.join('\n');
  for (const secret of [UPSTREAM_KEY, acme, limited, reader, 'secret prompt text'])
    expect(all).not.toContain(secret);
}, 240_000);
