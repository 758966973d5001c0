import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import type { Executor } from '../runs/executor.js';
import { getRun, toApiRun, type RunRow } from '../runs/store.js';

/** How often an idle stream sends a comment line, so proxies and clients keep it open. */
export const STREAM_KEEP_ALIVE_MS = 15_000;

/**
 * A Server-Sent Events response: `event: <name>` and `data: <json>` blocks, comment lines while
 * nothing else is sent. Writes after the client left are dropped.
 */
export class EventStream {
  readonly #raw: ServerResponse;
  readonly #keepAlive: ReturnType<typeof setInterval>;
  #lastWrite = Date.now();

  constructor(reply: FastifyReply, keepAliveMs = STREAM_KEEP_ALIVE_MS) {
    // From here on the response is ours: Fastify sends nothing more for it.
    reply.hijack();
    this.#raw = reply.raw;
    this.#raw.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      // Proxies that buffer responses (nginx) would hold the events back.
      'x-accel-buffering': 'no',
    });
    this.#raw.flushHeaders();
    this.#keepAlive = setInterval(() => {
      if (Date.now() - this.#lastWrite >= keepAliveMs / 2) this.#write(': keep-alive\n\n');
    }, keepAliveMs / 2);
    this.#keepAlive.unref();
    this.#raw.once('close', () => clearInterval(this.#keepAlive));
  }

  get open(): boolean {
    return !this.#raw.destroyed && !this.#raw.writableEnded;
  }

  send(event: string, data: unknown): void {
    this.#write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
  }

  /** A block with data only (the shape of Chat Completions streams); `[DONE]` is sent as is. */
  data(data: unknown): void {
    this.#write(`data: ${data === '[DONE]' ? data : JSON.stringify(data)}\n\n`);
  }

  end(): void {
    clearInterval(this.#keepAlive);
    if (this.open) this.#raw.end();
  }

  #write(text: string): void {
    if (!this.open) return;
    this.#lastWrite = Date.now();
    this.#raw.write(text);
  }
}

// A run that pauses for approvals ends its stream too: `run.requires_action` carries the
// pending calls, and the rest of the run is had by resuming it.
const finalEvent = {
  succeeded: 'run.completed',
  failed: 'run.failed',
  canceled: 'run.canceled',
  requires_action: 'run.requires_action',
} as const;

/**
 * Executes an admitted inline run here and streams it: `run.created`, `run.started`, then its
 * text deltas and tool calls as they happen, then exactly one final event. Resolves once the
 * run has ended (a client that left does not end it).
 */
export async function streamRun(
  reply: FastifyReply,
  executor: Executor,
  run: RunRow,
  options: { keepAliveMs?: number; db: Parameters<typeof getRun>[0] },
): Promise<void> {
  const stream = new EventStream(reply, options.keepAliveMs);
  stream.send('run.created', toApiRun(run));
  stream.send('run.started', toApiRun(run));
  const final = await executor.execute(run, {
    onText: (text) => stream.send('message.delta', { run_id: run.id, text }),
    onTool: (event) =>
      stream.send(event.type === 'started' ? 'tool.started' : 'tool.completed', {
        run_id: run.id,
        tool_call_id: event.toolCallId,
        name: event.name,
      }),
  });
  // Undefined: the run was ended elsewhere (lost, or its end could not be recorded); say how it stands.
  const current = final ?? (await getRun(options.db, run.tenant, run.id).catch(() => undefined)) ?? run;
  const status = current.status as keyof typeof finalEvent;
  stream.send(finalEvent[status] ?? 'run.failed', toApiRun(current));
  stream.end();
}
