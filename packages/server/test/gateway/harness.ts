import { once } from 'node:events';
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { createAgent, createConcurrencyLimiter, type ConcurrencyLimiter } from 'sluice';
import { startProviderStandIn, type ProviderStandIn, type Reply, type StandInOptions } from '@sluice/testkit';
import { defineConfig, type AppOptions, type ServerSettings, type SluiceConfig } from '@sluice/server';
import {
  afterThisTest,
  deferred,
  ownStandIn,
  startTestServer,
  type Deferred,
  type TestServer,
} from '../harness/index.js';

// A server with two gateways in front of one stand-in (`openai` and `claude`, the two APIs),
// an `echo` agent on the same limiter, and the official SDKs pointed at the gateways.

/** The provider key the gateways hold: a test checks that no caller ever sees it. */
export const UPSTREAM_KEY = 'sk-upstream-0123456789abcdefSECRET';

export interface GatewayServer extends TestServer {
  limiter: ConcurrencyLimiter<string>;
  /** A base URL of a gateway on this server. */
  baseUrl(name: string): string;
  openai(token: string, name?: string): OpenAI;
  anthropic(token: string, name?: string): Anthropic;
}

export interface GatewayServerOptions {
  limiter?: ConcurrencyLimiter<string>;
  /** Stand-in options (its replies, say); its `reply` defaults to an echo with fixed usage. */
  standIn?: StandInOptions;
  tenants?: SluiceConfig['tenants'];
  settings?: Partial<ServerSettings>;
  /** More of each gateway's options (a workload, prices). */
  gateway?: Partial<NonNullable<SluiceConfig['gateways']>[string]>;
  clock?: AppOptions['clock'];
  logger?: AppOptions['logger'];
  /** Another upstream for both gateways instead of the stand-in (a server of the test's own). */
  upstream?: string;
}

export async function startGatewayServer(options: GatewayServerOptions = {}): Promise<GatewayServer> {
  const provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => ({
        text: `echo ${JSON.stringify(r.messages.at(-1)?.content ?? '')}`,
        usage: { input: 11, output: 7 },
      }),
      ...options.standIn,
    }),
  );
  const limiter = options.limiter ?? createConcurrencyLimiter({ name: 'provider', maxConcurrent: 8 });
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const config = defineConfig({
    agents: { echo: createAgent({ model, credentials: { apiKey: 'agent-key' }, concurrency: { limiter } }) },
    gateways: {
      openai: {
        api: 'openai',
        upstream: options.upstream ?? provider.url,
        limiter,
        apiKey: UPSTREAM_KEY,
        ...options.gateway,
      },
      claude: {
        api: 'anthropic',
        upstream: options.upstream ?? provider.anthropicUrl,
        limiter,
        apiKey: UPSTREAM_KEY,
        ...options.gateway,
      },
    },
    tenants: options.tenants,
    settings: options.settings,
  });
  const server = await startTestServer({ config, provider, clock: options.clock, logger: options.logger });
  const baseUrl = (name: string) => `${server.server.url}/api/client/v1/gateway/${name}`;
  return {
    ...server,
    limiter,
    baseUrl,
    openai: (token, name = 'openai') => new OpenAI({ apiKey: token, baseURL: baseUrl(name), maxRetries: 0 }),
    anthropic: (token, name = 'claude') =>
      new Anthropic({ apiKey: token, baseURL: baseUrl(name), maxRetries: 0 }),
  };
}

/**
 * Stand-in replies that wait until the test lets them go, in arrival order: `held` are the
 * requests waiting now; `releaseAll` lets every one (and every later one) through.
 */
export function heldReplies(answer: Reply = { text: 'held answer', usage: { input: 5, output: 3 } }) {
  const held: Deferred<void>[] = [];
  let open = false;
  return {
    held,
    reply: async (): Promise<Reply> => {
      if (!open) {
        const gate = deferred<void>();
        held.push(gate);
        await gate.promise;
      }
      return answer;
    },
    releaseAll() {
      open = true;
      for (const gate of held.splice(0)) gate.resolve();
    },
  };
}

/** Every header and path the stand-in received, as one text to search for a secret. */
export const receivedText = (provider: ProviderStandIn) =>
  JSON.stringify(provider.requests.map((r) => ({ path: r.path, headers: r.headers })));

/** A request over a plain socket with the headers given, and its answer. */
export function rawRequest(
  url: string,
  options: {
    method: string;
    path: string;
    headers: Record<string, string>;
    body?: string;
    /** Sends the headers and no body, leaving the request open (its declared length unsent). */
    hold?: boolean;
  },
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { hostname, port, method: options.method, path: options.path, headers: options.headers },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
      },
    );
    req.on('error', reject);
    if (options.hold) req.flushHeaders();
    else req.end(options.body);
  });
}

/** A server of the test's own as the gateways' upstream; `handle` sees each request once read. */
export async function upstreamOf(handle: (req: IncomingMessage, res: ServerResponse) => void) {
  let requests = 0;
  const server = createServer((req, res) => {
    requests++;
    req.resume();
    req.once('end', () => handle(req, res));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  afterThisTest(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  return { url, requests: () => requests };
}
