import type { ServerResponse } from 'node:http';
import type { Reply, RequestRecord, StandInRequest } from './types.js';
import { sendJson, sleep, usageOf, writeFault } from './wire.js';

/**
 * The routes beside chat completions and messages that clients call: OpenAI's models list,
 * embeddings and responses, Anthropic's token count. Enough of each shape for the official
 * SDKs to parse it; the figures are the stand-in's rough ones.
 */

/** `input` of a Responses request, as chat messages. */
export function fromResponsesInput(body: Record<string, unknown>): StandInRequest['messages'] {
  const out: { role: string; content?: unknown }[] = [];
  if (typeof body.instructions === 'string') out.push({ role: 'system', content: body.instructions });
  const input = body.input;
  if (typeof input === 'string') out.push({ role: 'user', content: input });
  else if (Array.isArray(input))
    for (const item of input as { role?: string; content?: unknown }[])
      out.push({ role: item.role ?? 'user', content: item.content });
  return out;
}

export function sendModels(res: ServerResponse, record: RequestRecord, now: number): void {
  const created = Math.floor(now / 1000);
  sendJson(res, record, 200, {
    object: 'list',
    data: ['stand-in-small', 'stand-in-large'].map((id) => ({
      id,
      object: 'model',
      created,
      owned_by: 'stand-in',
    })),
  });
}

export function sendEmbeddings(
  res: ServerResponse,
  record: RequestRecord,
  body: Record<string, unknown>,
): void {
  const inputs = Array.isArray(body.input) ? (body.input as unknown[]) : [body.input];
  const tokens = inputs.reduce<number>((n, i) => n + Math.max(1, JSON.stringify(i ?? '').length >> 2), 0);
  sendJson(res, record, 200, {
    object: 'list',
    model: String(body.model ?? ''),
    data: inputs.map((input, index) => ({
      object: 'embedding',
      index,
      // A vector that depends on the input, so two inputs are told apart.
      embedding: [JSON.stringify(input ?? '').length / 100, index, 0.5],
    })),
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  });
}

export function sendTokenCount(res: ServerResponse, record: RequestRecord, request: StandInRequest): void {
  sendJson(res, record, 200, { input_tokens: JSON.stringify(request.messages).length >> 2 });
}

/** A Responses API answer: one output message, streamed as `response.*` events or whole. */
export async function respondResponses(
  request: StandInRequest,
  answer: Reply,
  res: ServerResponse,
  record: RequestRecord,
  chunkDelayMs: number,
  now: number,
): Promise<void> {
  if (
    writeFault(answer, res, record, (_, message) => ({
      error: { message, type: 'stand_in_error', code: null },
    }))
  )
    return;
  const text = 'text' in answer ? (answer.text ?? '') : '';
  const usage = usageOf(answer, request, text);
  const id = `resp_${request.index}`;
  const message = {
    id: `msg_${request.index}`,
    type: 'message',
    role: 'assistant',
    status: 'completed',
    content: [{ type: 'output_text', text, annotations: [] }],
  };
  const response = (status: string, output: unknown[], withUsage: boolean) => ({
    id,
    object: 'response',
    created_at: Math.floor(now / 1000),
    status,
    model: request.model,
    output,
    ...(withUsage
      ? {
          usage: {
            input_tokens: usage.input,
            output_tokens: usage.output,
            total_tokens: usage.input + usage.output,
          },
        }
      : {}),
  });
  record.status = 200;
  if (!request.stream) {
    sendJson(res, record, 200, response('completed', [message], true));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  let sequence = 0;
  const send = async (type: string, data: Record<string, unknown>) => {
    if (res.destroyed) return;
    res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...data })}\n\n`);
    await sleep(chunkDelayMs);
  };
  await send('response.created', { response: response('in_progress', [], false) });
  if ('stall' in answer) return;
  for (const piece of text.match(/.{1,16}/gs) ?? [])
    await send('response.output_text.delta', {
      item_id: message.id,
      output_index: 0,
      content_index: 0,
      delta: piece,
    });
  await send('response.output_text.done', { item_id: message.id, output_index: 0, content_index: 0, text });
  if (res.destroyed) return;
  record.done = true;
  res.end(
    `event: response.completed\ndata: ${JSON.stringify({ type: 'response.completed', sequence_number: sequence, response: response('completed', [message], true) })}\n\n`,
  );
}
