import { WebSocket } from 'ws';
import { createAgent, tool } from 'sluice';
import type { RunningServer, RunsConfig, ServerSettings, WebsocketConfig } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import {
  afterThisTest,
  deferred,
  lastUserText,
  ownStandIn,
  startTestServer,
  type ApiClient,
  type Body,
  type Deferred,
} from '../helpers.js';

/**
 * One server per test file (for `beforeAll`, closed after the file), against a stand-in whose answers depend on the
 * prompt: "hold:KEY" waits until `release(KEY)`, "stall" never answers, "fail" is a provider 400,
 * "look" asks for the `lookup` tool once (agent `researcher`), anything else is answered in
 * several streamed pieces.
 */
export interface FileServer {
  server: RunningServer;
  provider: ProviderStandIn;
  url: string;
  wsUrl: string;
  token(user: string, role?: 'admin' | 'member' | 'read'): Promise<string>;
  /** The harness's API client of the server. */
  call: ApiClient['call'];
  release(key: string): void;
  /** The conversations the stand-in was asked to answer, in order: each message's role and text. */
  readonly asked: { role: string; text: string }[][];
  close(): Promise<void>;
}

export const answerTo = (prompt: string) =>
  `The answer to "${prompt}" arrives in several streamed pieces, in order.`;

export async function startFileServer(
  options: { settings?: Partial<ServerSettings>; runs?: RunsConfig; websocket?: WebsocketConfig } = {},
): Promise<FileServer> {
  const gates = new Map<string, Deferred>();
  const gateOf = (key: string) => gates.get(key) ?? gates.set(key, deferred()).get(key)!;
  const asked: FileServer['asked'] = [];
  const provider = ownStandIn(
    await startProviderStandIn({
      reply: async (r) => {
        asked.push(
          r.messages.map((m) => ({
            role: m.role,
            text: typeof m.content === 'string' ? m.content : JSON.stringify(m.content),
          })),
        );
        const results = r.messages.filter((m) => m.role === 'tool');
        if (results.length > 0) return { text: `found ${results.map((m) => String(m.content)).join(',')}` };
        const last = lastUserText(r);
        const held = /hold:(\w+)/.exec(last);
        if (held) await gateOf(held[1]!).promise;
        if (last.includes('stall')) return { stall: true };
        if (last.includes('fail')) return { status: 400, message: 'the model refused' };
        if (last.includes('look')) return { toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }] };
        return { text: answerTo(last) };
      },
    }),
  );
  const { server, token, call } = await startTestServer({
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
    settings: options.settings,
    runs: options.runs,
    websocket: options.websocket,
  });
  // Before the server closes: what a gate holds answers, instead of waiting forever.
  const openGates = () => {
    for (const g of gates.values()) g.resolve();
  };
  afterThisTest(openGates, 'the gates of the stand-in');
  return {
    server,
    provider,
    url: `${server.url}/api/client/v1`,
    wsUrl: `${server.url.replace(/^http/, 'ws')}/api/client/v1/ws`,
    token: (user, role = 'member') => token({ tenant: 't', project: 'p', user, role }),
    call,
    release: (key) => gateOf(key).resolve(),
    asked,
    async close() {
      openGates();
      await server.close();
    },
  };
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- frames are checked field by field
export type Frame = { type: string; request_id: string | null; data?: any; error?: any };

/** A `ws` client that keeps every frame it receives, in order, and waits for the ones a test needs. */
export class Client {
  readonly frames: Frame[] = [];
  readonly closed: Promise<{ code: number; reason: string }>;
  readonly #waiters = new Set<() => void>();

  private constructor(readonly ws: WebSocket) {
    ws.on('message', (data) => {
      this.frames.push(JSON.parse(String(data)) as Frame);
      for (const wake of this.#waiters) wake();
    });
    this.closed = new Promise((resolve) =>
      ws.once('close', (code, reason) => {
        resolve({ code, reason: String(reason) });
        for (const wake of this.#waiters) wake();
      }),
    );
  }

  /** Opens a socket with the token in the Authorization header (or in the query). */
  static async open(url: string, token: string, how: 'header' | 'query' = 'header'): Promise<Client> {
    const ws =
      how === 'header'
        ? new WebSocket(url, { headers: { authorization: `bearer ${token}` } })
        : new WebSocket(`${url}?access_token=${encodeURIComponent(token)}`);
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
      ws.once('unexpected-response', (_req, res) => reject(new Error(`upgrade answered ${res.statusCode}`)));
    });
    return new Client(ws);
  }

  send(frame: unknown): void {
    this.ws.send(typeof frame === 'string' ? frame : JSON.stringify(frame));
  }

  /** Waits until a frame matching `match` has arrived (bounded), and returns it. */
  async until(match: (f: Frame) => boolean, what = 'frame'): Promise<Frame> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const found = this.frames.find(match);
      if (found) return found;
      if (this.ws.readyState === WebSocket.CLOSED) throw new Error(`socket closed before ${what}`);
      if (Date.now() > deadline) throw new Error(`${what} not received`);
      await new Promise<void>((resolve) => {
        const wake = () => {
          this.#waiters.delete(wake);
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(wake, 1_000);
        this.#waiters.add(wake);
      });
    }
  }

  /** The frames of one request, in order, once its final frame (or error) has arrived. */
  async request(requestId: string): Promise<Frame[]> {
    await this.until(
      (f) =>
        f.request_id === requestId &&
        ['run.completed', 'run.failed', 'run.canceled', 'error'].includes(f.type),
      `the end of ${requestId}`,
    );
    return this.frames.filter((f) => f.request_id === requestId);
  }

  async close(): Promise<void> {
    this.ws.close();
    await this.closed;
  }
}

/** An upgrade the server refuses: its HTTP status, headers and JSON body. */
export async function refusedUpgrade(
  url: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; retryAfter: string | undefined; body: Body }> {
  const ws = new WebSocket(url, { headers });
  return new Promise((resolve, reject) => {
    ws.once('open', () => {
      ws.close();
      reject(new Error('the upgrade was accepted'));
    });
    ws.once('unexpected-response', (_req, res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (text += chunk));
      res.on('end', () => {
        // The connection is left open on purpose: the server must end a refused upgrade itself.
        resolve({
          status: res.statusCode ?? 0,
          retryAfter: res.headers['retry-after'] as string | undefined,
          body: JSON.parse(text) as Body,
        });
      });
    });
    ws.once('error', () => undefined);
  });
}
