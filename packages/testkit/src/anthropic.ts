import type { ServerResponse } from 'node:http';
import type { Reply, RequestRecord, StandInRequest } from './types.js';
import { cutAfterFlush, sendJson, sleep, usageOf, writeFault } from './wire.js';

type Block = {
  type: string;
  text?: string;
  content?: unknown;
  tool_use_id?: string;
  id?: string;
  name?: string;
  input?: unknown;
};

/** An Anthropic Messages request body, seen in the OpenAI shape the responders use. */
export function fromAnthropic(body: Record<string, unknown>): StandInRequest['messages'] {
  const out: { role: string; content?: unknown; tool_call_id?: string; tool_calls?: unknown[] }[] = [];
  const system = body.system;
  if (system !== undefined) {
    const text = typeof system === 'string' ? system : (system as Block[]).map((b) => b.text ?? '').join('');
    out.push({ role: 'system', content: text });
  }
  for (const m of (body.messages as { role: string; content: string | Block[] }[] | undefined) ?? []) {
    if (typeof m.content === 'string') {
      out.push({ role: m.role, content: m.content });
      continue;
    }
    const text = m.content
      .filter((b) => b.type === 'text')
      .map((b) => b.text ?? '')
      .join('');
    const toolUses = m.content.filter((b) => b.type === 'tool_use');
    const results = m.content.filter((b) => b.type === 'tool_result');
    for (const r of results) {
      const content =
        typeof r.content === 'string'
          ? r.content
          : ((r.content as Block[]) ?? []).map((b) => b.text ?? '').join('');
      out.push({ role: 'tool', content, tool_call_id: r.tool_use_id });
    }
    if (text || toolUses.length > 0 || results.length === 0) {
      out.push({
        role: m.role,
        content: text,
        ...(toolUses.length
          ? { tool_calls: toolUses.map((t) => ({ id: t.id, function: { name: t.name } })) }
          : {}),
      });
    }
  }
  return out;
}

/** Writes a reply in the Anthropic Messages wire protocol. */
export async function respondAnthropic(
  request: StandInRequest,
  answer: Reply,
  res: ServerResponse,
  record: RequestRecord,
  chunkDelayMs: number,
): Promise<void> {
  const errorType = (status: number) =>
    status === 429
      ? 'rate_limit_error'
      : status === 529
        ? 'overloaded_error'
        : status >= 500
          ? 'api_error'
          : 'invalid_request_error';
  if (
    writeFault(answer, res, record, (status, message) => ({
      type: 'error',
      error: { type: errorType(status), message },
    }))
  ) {
    return;
  }
  const id = `msg_${request.index}`;
  const text = 'text' in answer ? (answer.text ?? '') : '';
  const toolUses =
    'toolCalls' in answer
      ? answer.toolCalls.map((c, i) => ({
          type: 'tool_use',
          id: c.id ?? `toolu_${request.index}_${i}`,
          name: c.name,
          input: c.arguments ?? {},
        }))
      : [];
  const usage = usageOf(answer, request, text);
  const stopReason = toolUses.length > 0 ? 'tool_use' : 'end_turn';
  record.status = 200;

  if (!request.stream) {
    sendJson(res, record, 200, {
      id,
      type: 'message',
      role: 'assistant',
      model: request.model,
      content: [...(text ? [{ type: 'text', text }] : []), ...toolUses],
      stop_reason: stopReason,
      stop_sequence: null,
      usage: { input_tokens: usage.input, output_tokens: usage.output },
    });
    return;
  }

  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
  });
  const send = async (event: string, data: Record<string, unknown>) => {
    if (res.destroyed) return;
    res.write(`event: ${event}\ndata: ${JSON.stringify({ type: event, ...data })}\n\n`);
    await sleep(chunkDelayMs);
  };
  await send('message_start', {
    message: {
      id,
      type: 'message',
      role: 'assistant',
      model: request.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: usage.input, output_tokens: 1 },
    },
  });
  if ('stall' in answer) return;
  let index = 0;
  if (text || 'drop' in answer) {
    await send('content_block_start', { index, content_block: { type: 'text', text: '' } });
    if ('drop' in answer) {
      await send('content_block_delta', { index, delta: { type: 'text_delta', text: 'This answer is cut' } });
      await cutAfterFlush(res);
      return;
    }
    for (const piece of text.match(/.{1,16}/gs) ?? []) {
      await send('content_block_delta', { index, delta: { type: 'text_delta', text: piece } });
    }
    await send('content_block_stop', { index });
    index++;
  }
  for (const use of toolUses) {
    await send('content_block_start', {
      index,
      content_block: { type: 'tool_use', id: use.id, name: use.name, input: {} },
    });
    await send('content_block_delta', {
      index,
      delta: { type: 'input_json_delta', partial_json: JSON.stringify(use.input) },
    });
    await send('content_block_stop', { index });
    index++;
  }
  await send('message_delta', {
    delta: { stop_reason: stopReason, stop_sequence: null },
    usage: { output_tokens: usage.output },
  });
  if (res.destroyed) return;
  record.done = true;
  res.end(`event: message_stop\ndata: ${JSON.stringify({ type: 'message_stop' })}\n\n`);
}
