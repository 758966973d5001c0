import type { ServerResponse } from 'node:http';
import type { Reply, RequestRecord, StandInRequest } from './types.js';
import { cutAfterFlush, sendJson, sleep, usageOf, writeFault } from './wire.js';

/** Writes a reply in the OpenAI chat-completions wire protocol, streamed or not. */
export async function respondOpenAi(
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
  ) {
    return;
  }
  const id = `chatcmpl-${request.index}`;
  const created = Math.floor(now / 1000);
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
    await sleep(chunkDelayMs);
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
