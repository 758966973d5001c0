import { createHmac } from 'node:crypto';
import { rmSync } from 'node:fs';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve, type RunningServer, type SluiceConfig } from '@sluice/server';
import { signWebhook } from '../../src/callbacks/signing.js';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { lastUserText, preparedDataDir, standInModel, type Body, type Reply } from '../helpers.js';

/** A server for a whole test file (closed by `close`), on a copy of the migrated PGlite template. */
export interface FileServer {
  server: RunningServer;
  provider: ProviderStandIn;
  token(
    who?: Partial<{ tenant: string; project: string; user: string; role: 'admin' | 'member' | 'read' }>,
  ): Promise<string>;
  call(method: string, path: string, token: string, body?: unknown): Promise<Reply>;
  close(): Promise<void>;
}

export async function startFileServer(options: {
  tenants?: SluiceConfig['tenants'];
  settings?: SluiceConfig['settings'];
}): Promise<FileServer> {
  const dir = await preparedDataDir();
  const provider = await startProviderStandIn({
    reply: (r) => ({ text: `done ${lastUserText(r).slice(0, 40)}`, usage: { input: 1, output: 1 } }),
  });
  const model = standInModel(provider);
  const server = await serve({
    config: defineConfig({
      agents: {
        echo: createAgent({ model, credentials: { apiKey: 'k' } }),
        other: createAgent({ model, credentials: { apiKey: 'k' } }),
      },
      tenants: options.tenants,
      settings: options.settings,
    }),
    port: 0,
    dataDir: dir,
    databaseUrl: '',
    logger: false,
  });
  return {
    server,
    provider,
    token: async (who = {}) =>
      (
        await createToken(server.store.db, {
          tenant: who.tenant ?? 't',
          project: who.project ?? 'p',
          user: who.user ?? 'u',
          role: who.role ?? 'admin',
        })
      ).secret,
    call: async (method, path, token, body) => {
      const r = await fetch(`${server.url}/api/client/v1${path}`, {
        method,
        headers: {
          authorization: `Bearer ${token}`,
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        },
        body: body !== undefined ? JSON.stringify(body) : undefined,
      });
      return {
        status: r.status,
        retryAfter: r.headers.get('retry-after'),
        headers: r.headers,
        body: (await r.json()) as Body,
      };
    },
    close: async () => {
      await server.close();
      await provider.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Headers of a Standard Webhooks sender. */
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
