import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fromAnthropic, respondAnthropic } from './anthropic.js';
import type { ProviderStandIn, Reply, RequestRecord, StandInOptions, StandInRequest } from './types.js';
import { cutAfterFlush, sendJson, usageOf, writeFault } from './wire.js';

const sleep = (ms: number) => (ms > 0 ? new Promise((r) => setTimeout(r, ms)) : Promise.resolve());

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
  let inFlight = 0;
  let peak = 0;
  let counter = 0;
  const records: RequestRecord[] = [];
  let idleWaiters: (() => void)[] = [];
  const reply = options.reply ?? ((r: StandInRequest) => ({ text: `Echo: ${lastUserText(r.messages)}` }));

  const server = createServer((req, res) => {
    void handle(req, res).catch(() => {
      if (!res.headersSent) res.writeHead(500).end();
      else res.destroy();
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const protocol = req.url?.endsWith('/chat/completions')
      ? 'openai'
      : req.url?.endsWith('/v1/messages')
        ? 'anthropic'
        : undefined;
    if (req.method !== 'POST' || !protocol) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `no route ${req.method} ${req.url}`, type: 'not_found' } }));
      return;
    }
    // In flight from the moment the request arrives until its response ends or its connection closes.
    inFlight++;
    peak = Math.max(peak, inFlight);
    const index = ++counter;
    let settled = false;
    const record: RequestRecord = {
      index,
      model: '',
      apiKey: undefined,
      stream: false,
      messageCount: 0,
      status: undefined,
      aborted: false,
      done: false,
    };
    records.push(record);
    const finish = () => {
      if (settled) return;
      settled = true;
      inFlight--;
      if (!record.done) record.aborted = true;
      if (inFlight === 0) {
        const waiters = idleWaiters;
        idleWaiters = [];
        for (const w of waiters) w();
      }
    };
    res.on('close', finish);

    const body = await readJson(req);
    const auth = req.headers.authorization;
    const request: StandInRequest = {
      index,
      api: protocol === 'openai' ? 'openai-completions' : 'anthropic-messages',
      model: String(body.model ?? ''),
      messages:
        protocol === 'openai' ? ((body.messages as StandInRequest['messages']) ?? []) : fromAnthropic(body),
      tools:
        protocol === 'openai'
          ? ((body.tools as StandInRequest['tools']) ?? [])
          : ((body.tools as { name?: string }[] | undefined) ?? []).map((t) => ({
              function: { name: t.name },
            })),
      stream: body.stream === true,
      apiKey:
        protocol === 'openai'
          ? auth?.startsWith('Bearer ')
            ? auth.slice(7)
            : undefined
          : (req.headers['x-api-key'] as string | undefined),
      body,
    };
    Object.assign(record, {
      model: request.model,
      apiKey: request.apiKey,
      stream: request.stream,
      messageCount: request.messages.length,
    });
    const latency =
      typeof options.latencyMs === 'function' ? options.latencyMs(request) : (options.latencyMs ?? 0);
    await sleep(latency);
    if (res.destroyed) return;
    const answer = await reply(request);
    if (request.api === 'anthropic-messages')
      await respondAnthropic(request, answer, res, record, options.chunkDelayMs ?? 0);
    else await respond(request, answer, res, record);
  }

  async function respond(request: StandInRequest, answer: Reply, res: ServerResponse, record: RequestRecord) {
    if (
      writeFault(answer, res, record, (_, message) => ({
        error: { message, type: 'stand_in_error', code: null },
      }))
    ) {
      return;
    }
    const id = `chatcmpl-${request.index}`;
    const created = Math.floor(Date.now() / 1000);
    const text = 'text' in answer ? (answer.text ?? '') : '';
    const toolCalls =
      'toolCalls' in answer
        ? answer.toolCalls.map((c, i) => ({
            id: c.id ?? `call_${request.index}_${i}`,
            type: 'function' as const,
            function: { name: c.name, arguments: JSON.stringify(c.arguments ?? {}) },
          }))
        : [];
    const usage = usageOf(answer, request, text);
    const finish = toolCalls.length > 0 ? 'tool_calls' : 'stop';
    const usageBody = {
      prompt_tokens: usage.input,
      completion_tokens: usage.output,
      total_tokens: usage.input + usage.output,
    };

    record.status = 200;
    if (!request.stream) {
      sendJson(res, record, 200, {
        id,
        object: 'chat.completion',
        created,
        model: request.model,
        choices: [
          {
            index: 0,
            message: {
              role: 'assistant',
              content: text || null,
              ...(toolCalls.length ? { tool_calls: toolCalls } : {}),
            },
            finish_reason: finish,
          },
        ],
        usage: usageBody,
      });
      return;
    }

    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    });
    const send = async (delta: Record<string, unknown>, finishReason: string | null = null) => {
      if (res.destroyed) return;
      res.write(
        `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: request.model, choices: [{ index: 0, delta, finish_reason: finishReason }] })}\n\n`,
      );
      await sleep(options.chunkDelayMs ?? 0);
    };
    await send({ role: 'assistant', content: '' });
    if ('stall' in answer) return; // nothing more: the client must give up
    if ('drop' in answer) {
      // Some of the answer arrives, then the connection breaks.
      await send({ content: 'This answer is cut' });
      await cutAfterFlush(res);
      return;
    }
    for (const piece of text.match(/.{1,16}/gs) ?? []) await send({ content: piece });
    for (const [i, call] of toolCalls.entries()) {
      await send({
        tool_calls: [
          { index: i, id: call.id, type: 'function', function: { name: call.function.name, arguments: '' } },
        ],
      });
      await send({ tool_calls: [{ index: i, function: { arguments: call.function.arguments } }] });
    }
    await send({}, finish);
    if (res.destroyed) return;
    res.write(
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: request.model, choices: [], usage: usageBody })}\n\n`,
    );
    record.done = true;
    res.end('data: [DONE]\n\n');
  }

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
