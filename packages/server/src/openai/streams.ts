import type { FastifyReply } from 'fastify';
import type { Database } from '@sluice/postgres/database';
import type { Executor } from '../runs/executor.js';
import { getRun, type RunRow } from '../runs/store.js';
import { EventStream } from '../routes/stream-run.js';
import { messageIdOf, outputMessage, toChatCompletion, toResponse } from './render.js';
import { interrupted, wasInterrupted } from './interrupted.js';
import { requiresAction } from './paused.js';

/** Runs executed here and streamed in the OpenAI APIs' own event shapes. */

interface StreamOptions {
  db: Database;
  keepAliveMs: number;
}

async function finalRow(
  executor: Executor,
  run: RunRow,
  listener: Parameters<Executor['execute']>[1],
  db: Database,
) {
  const final = await executor.execute(run, listener);
  return final ?? (await getRun(db, run.tenant, run.id).catch(() => undefined)) ?? run;
}

/**
 * A Responses stream: `response.created`, `response.in_progress`, the message item and its text
 * part as the first text arrives, its deltas, then the `.done` events and one of
 * `response.completed`, `response.failed` or `response.incomplete`, or for a run its server
 * interrupted the API's `error` event (`agent_run_interrupted`). Every event carries its
 * `type` and a `sequence_number` from 0; no event type outside the API's own.
 */
export async function streamResponse(
  reply: FastifyReply,
  executor: Executor,
  run: RunRow,
  options: StreamOptions,
): Promise<void> {
  const stream = new EventStream(reply, options.keepAliveMs);
  let sequence = 0;
  const send = (type: string, body: object) =>
    stream.send(type, { type, sequence_number: sequence++, ...body });
  const started = toResponse(run);
  send('response.created', { response: started });
  send('response.in_progress', { response: started });
  const item = { item_id: messageIdOf(run.id), output_index: 0, content_index: 0 };
  let opened = false;
  const open = () => {
    if (opened) return;
    opened = true;
    send('response.output_item.added', { output_index: 0, item: outputMessage(run.id, '', 'in_progress') });
    send('response.content_part.added', {
      ...item,
      part: { type: 'output_text', text: '', annotations: [], logprobs: [] },
    });
  };
  const current = await finalRow(
    executor,
    run,
    {
      onText: (delta) => {
        open();
        send('response.output_text.delta', { ...item, delta, logprobs: [] });
      },
    },
    options.db,
  );
  const response = toResponse(current);
  if (wasInterrupted(current)) {
    // The Responses API's own `error` event, with the error object the client raises as well.
    const { error } = interrupted(current).body();
    send('error', { code: error.code, message: error.message, param: null, error });
  } else if (response.status === 'completed') {
    open();
    const text = response.output_text;
    send('response.output_text.done', { ...item, text, logprobs: [] });
    send('response.content_part.done', {
      ...item,
      part: { type: 'output_text', text, annotations: [], logprobs: [] },
    });
    send('response.output_item.done', { output_index: 0, item: outputMessage(run.id, text, 'completed') });
    send('response.completed', { response });
  } else if (response.status === 'failed') {
    send('response.failed', { response });
  } else {
    // Cancelled or cut short: the API's event for a response that ended without finishing.
    send('response.incomplete', { response });
  }
  stream.end();
}

/**
 * A Chat Completions stream: `chat.completion.chunk` objects (the role first, then the text
 * deltas, then the finish reason, and the usage when asked), then `[DONE]`. A run that fails
 * ends the stream with an `error` object, which the client raises.
 */
export async function streamChat(
  reply: FastifyReply,
  executor: Executor,
  run: RunRow,
  options: StreamOptions & { model: string; includeUsage: boolean },
): Promise<void> {
  const stream = new EventStream(reply, options.keepAliveMs);
  const base = toChatCompletion(run, options.model);
  const chunk = (choices: object[], extra: object = {}) =>
    stream.data({
      id: base.id,
      object: 'chat.completion.chunk',
      created: base.created,
      model: base.model,
      service_tier: base.service_tier,
      system_fingerprint: null,
      choices,
      ...extra,
    });
  chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null }]);
  const current = await finalRow(
    executor,
    run,
    { onText: (content) => chunk([{ index: 0, delta: { content }, finish_reason: null, logprobs: null }]) },
    options.db,
  );
  if (current.status === 'succeeded') {
    chunk([{ index: 0, delta: {}, finish_reason: 'stop', logprobs: null }]);
    if (options.includeUsage) chunk([], { usage: toChatCompletion(current, options.model).usage });
    stream.data('[DONE]');
  } else if (current.status === 'requires_action') {
    stream.data({ error: requiresAction(current).body().error });
  } else if (wasInterrupted(current)) {
    stream.data({ error: interrupted(current).body().error });
  } else {
    stream.data({
      error: {
        type: current.status === 'canceled' ? 'run_canceled' : 'run_failed',
        code: current.status === 'canceled' ? 'run_canceled' : 'run_failed',
        message: current.error
          ? `Run ${current.id} failed: ${current.error.type}: ${current.error.message}`
          : `Run ${current.id} was canceled`,
        param: null,
        run_id: current.id,
      },
    });
  }
  stream.end();
}
