import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isRefusal, ProviderAccount, type Admission } from './account.js';
import { accountHeaders, refusalBody } from './account-headers.js';
import { fromAnthropic, respondAnthropic } from './anthropic.js';
import { imageNotes, imagesOf } from './images.js';
import { respondOpenAi } from './openai.js';
import {
  fromResponsesInput,
  respondResponses,
  sendEmbeddings,
  sendModels,
  sendTokenCount,
} from './other-routes.js';
import type { ProviderStandIn, RequestRecord, StandInOptions, StandInRequest } from './types.js';
import { outputCap, promptTokens, reportedUsage, sendJson, sleep } from './wire.js';

type Protocol = 'openai' | 'anthropic';
/** What a request asks for, by its method and the end of its path. */
type Route = 'chat' | 'messages' | 'responses' | 'embeddings' | 'count_tokens' | 'models';

function lastUserText(messages: StandInRequest['messages']): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!;
    if (m.role !== 'user') continue;
    if (typeof m.content === 'string') return m.content;
    if (Array.isArray(m.content)) {
      return m.content.map((p: { text?: string }) => p.text ?? '').join('');
    }
  }
  return '';
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}') as Record<string, unknown>;
}

function routeOf(req: IncomingMessage): Route | undefined {
  const path = (req.url ?? '').split('?')[0]!;
  if (req.method === 'GET') return path.endsWith('/models') ? 'models' : undefined;
  if (req.method !== 'POST') return undefined;
  if (path.endsWith('/chat/completions')) return 'chat';
  if (path.endsWith('/v1/messages')) return 'messages';
  if (path.endsWith('/v1/messages/count_tokens')) return 'count_tokens';
  if (path.endsWith('/responses')) return 'responses';
  if (path.endsWith('/embeddings')) return 'embeddings';
  return undefined;
}

const protocolOfRoute = (route: Route): Protocol =>
  route === 'messages' || route === 'count_tokens' ? 'anthropic' : 'openai';

/** A request body of either protocol, in the OpenAI shape the responders read. */
function toStandInRequest(
  route: Route,
  index: number,
  body: Record<string, unknown>,
  headers: IncomingHttpHeaders,
): StandInRequest {
  const protocol = protocolOfRoute(route);
  const auth = headers.authorization;
  return {
    index,
    api:
      protocol === 'anthropic'
        ? 'anthropic-messages'
        : route === 'responses'
          ? 'openai-responses'
          : 'openai-completions',
    model: String(body.model ?? ''),
    messages:
      protocol === 'anthropic'
        ? fromAnthropic(body)
        : route === 'responses'
          ? fromResponsesInput(body)
          : ((body.messages as StandInRequest['messages']) ?? []),
    tools:
      protocol === 'openai'
        ? ((body.tools as StandInRequest['tools']) ?? [])
        : ((body.tools as { name?: string }[] | undefined) ?? []).map((t) => ({
            function: { name: t.name },
          })),
    images: imagesOf(protocol, body),
    stream: body.stream === true,
    apiKey:
      protocol === 'openai'
        ? auth?.startsWith('Bearer ')
          ? auth.slice(7)
          : undefined
        : (headers['x-api-key'] as string | undefined),
    body,
  };
}

function newRecord(index: number, req: IncomingMessage): RequestRecord {
  return {
    index,
    method: req.method ?? '',
    path: req.url ?? '',
    headers: { ...req.headers },
    model: '',
    apiKey: undefined,
    stream: false,
    messageCount: 0,
    images: [],
    status: undefined,
    aborted: false,
    done: false,
  };
}

/**
 * Starts the stand-in on 127.0.0.1.
 *
 * @example
 * const provider = await startProviderStandIn({ latencyMs: 50 });
 * const agent = createAgent({
 *   model: { api: 'openai-completions', provider: 'stand-in', id: 'demo', baseUrl: provider.url },
 *   credentials: { apiKey: 'test' },
 * });
 */
export async function startProviderStandIn(options: StandInOptions = {}): Promise<ProviderStandIn> {
  const clock = options.clock ?? Date;
  const account = options.limits ? new ProviderAccount(options.limits, clock) : undefined;
  let inFlight = 0;
  let peak = 0;
  let counter = 0;
  const records: RequestRecord[] = [];
  let idleWaiters: (() => void)[] = [];
  const reply =
    options.reply ??
    ((r: StandInRequest) => ({ text: `Echo: ${lastUserText(r.messages)}${imageNotes(r.images)}` }));

  const server = createServer((req, res) => {
    void handle(req, res).catch(() => {
      if (!res.headersSent) res.writeHead(500).end();
      else res.destroy();
    });
  });

  /** Counts the request in flight from its arrival until its response ends or its connection closes. */
  function track(res: ServerResponse, record: RequestRecord, onEnd: () => void): void {
    inFlight++;
    peak = Math.max(peak, inFlight);
    res.once('close', () => {
      inFlight--;
      if (!record.done) record.aborted = true;
      onEnd();
      if (inFlight === 0) {
        const waiters = idleWaiters;
        idleWaiters = [];
        for (const w of waiters) w();
      }
    });
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const route = routeOf(req);
    if (!route) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `no route ${req.method} ${req.url}`, type: 'not_found' } }));
      return;
    }
    const record = newRecord(++counter, req);
    records.push(record);
    const protocol = protocolOfRoute(route);
    // What the account charged the request, and the tokens its response reports it used.
    const charge: { admission?: Admission; used?: number | undefined } = {};
    track(res, record, () => {
      if (!charge.admission) return;
      account!.finish(charge.admission, record.done && record.status === 200 ? charge.used : undefined);
    });

    if (route === 'models') return sendModels(res, record, clock.now());
    const body = await readJson(req);
    const request = toStandInRequest(route, record.index, body, req.headers);
    Object.assign(record, {
      model: request.model,
      apiKey: request.apiKey,
      stream: request.stream,
      messageCount: request.messages.length,
      images: request.images.map(({ data: _data, ...rest }) => rest),
    });
    if (account) {
      const outcome = account.admit(promptTokens(request) + outputCap(body));
      if (isRefusal(outcome)) {
        record.rateLimited = outcome.limit;
        sendJson(
          res,
          record,
          429,
          refusalBody(protocol, outcome),
          accountHeaders(protocol, account, outcome),
        );
        return;
      }
      charge.admission = outcome;
      for (const [name, value] of Object.entries(accountHeaders(protocol, account)))
        res.setHeader(name, value);
    }
    if (route === 'embeddings') return sendEmbeddings(res, record, body);
    if (route === 'count_tokens') return sendTokenCount(res, record, request);
    const latency =
      typeof options.latencyMs === 'function' ? options.latencyMs(request) : (options.latencyMs ?? 0);
    await sleep(latency);
    if (res.destroyed) return;
    const answer = await reply(request);
    const usage = reportedUsage(answer, request);
    charge.used = usage && usage.input + usage.output;
    const chunkDelayMs = options.chunkDelayMs ?? 0;
    if (route === 'messages') await respondAnthropic(request, answer, res, record, chunkDelayMs);
    else if (route === 'responses')
      await respondResponses(request, answer, res, record, chunkDelayMs, clock.now());
    else await respondOpenAi(request, answer, res, record, chunkDelayMs, clock.now());
  }
  if (options.keepAliveTimeoutMs !== undefined) server.keepAliveTimeout = options.keepAliveTimeoutMs;
  await new Promise<void>((resolve) => server.listen(options.port ?? 0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    anthropicUrl: `http://127.0.0.1:${port}`,
    port,
    get inFlight() {
      return inFlight;
    },
    get peakInFlight() {
      return peak;
    },
    requests: records,
    get rateLimited() {
      return account?.rateLimited ?? 0;
    },
    resetPeak() {
      peak = inFlight;
    },
    idle() {
      return inFlight === 0 ? Promise.resolve() : new Promise<void>((r) => idleWaiters.push(r));
    },
    close() {
      server.closeAllConnections();
      return new Promise<void>((resolve, reject) => server.close((e) => (e ? reject(e) : resolve())));
    },
  };
}
