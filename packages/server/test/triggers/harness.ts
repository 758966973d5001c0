import { createHmac } from 'node:crypto';
import { createAgent } from 'sluice';
import type { RunningServer, SluiceConfig } from '@sluice/server';
import { signWebhook } from '../../src/callbacks/signing.js';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { lastUserText, ownStandIn, startTestServer, type Body, type Reply, type Who } from '../helpers.js';

/** A server for a whole test file, on a copy of the migrated PGlite template. */
export interface FileServer {
  server: RunningServer;
  provider: ProviderStandIn;
  token(who?: Who): Promise<string>;
  call(method: string, path: string, token: string, body?: unknown): Promise<Reply>;
  close(): Promise<void>;
}

/** A server with agents `echo` and `other`, answering `done <prompt>`; closed after the test (or file). */
export async function startFileServer(options: {
  tenants?: SluiceConfig['tenants'];
  settings?: SluiceConfig['settings'];
}): Promise<FileServer> {
  const provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => ({ text: `done ${lastUserText(r).slice(0, 40)}`, usage: { input: 1, output: 1 } }),
    }),
  );
  const t = await startTestServer({
    provider,
    agents: (model) => ({ other: createAgent({ model, credentials: { apiKey: 'k' } }) }),
    tenants: options.tenants,
    settings: options.settings,
  });
  return {
    server: t.server,
    provider,
    token: t.token,
    call: (method, path, token, body) => t.call(method, path, body, token),
    close: () => t.server.close(),
  };
}

export function standardHeaders(
  secret: string,
  id: string,
  body: string,
  timestampS = Math.floor(Date.now() / 1000),
) {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(timestampS),
    'webhook-signature': signWebhook(secret, id, timestampS, body),
  };
}

/** Headers GitHub sends: the hex HMAC of the body keyed with the secret's text. */
export function githubHeaders(secret: string, body: string, delivery?: string) {
  return {
    'x-hub-signature-256': `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`,
    'x-github-event': 'push',
    ...(delivery === undefined ? {} : { 'x-github-delivery': delivery }),
  };
}

/** POSTs a webhook as a sender would: no bearer token, the body sent byte for byte. */
export async function sendWebhook(
  url: string,
  body: string,
  headers: Record<string, string>,
  contentType = 'application/json',
): Promise<Reply> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': contentType, ...headers }, body });
  return {
    status: r.status,
    retryAfter: r.headers.get('retry-after'),
    headers: r.headers,
    body: (await r.json()) as Body,
  };
}
