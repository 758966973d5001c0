import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import type { ToolEvent } from 'sluice';
import { systemClock } from 'sluice/concurrency';
import { settingDefaults } from '../settings.js';
import type { Executor } from '../runs/executor.js';
import { getRun, toApiRun, type RunRow } from '../runs/store.js';

/** How often an idle stream sends a comment line, so proxies and clients keep it open. */
export const STREAM_KEEP_ALIVE_MS = settingDefaults.streamKeepAliveMs;

/**
 * A Server-Sent Events response: `event: <name>` and `data: <json>` blocks, comment lines while
 * nothing else is sent. Writes after the client left are dropped.
 */
export class EventStream {
  readonly #raw: ServerResponse;
  readonly #keepAlive: ReturnType<typeof setInterval>;
  // Idleness on the wire, timed with Node's own timers (setInterval): the system clock's time.
  #lastWrite = systemClock.now();

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
      if (systemClock.now() - this.#lastWrite >= keepAliveMs / 2) this.#write(': keep-alive\n\n');
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
    this.#lastWrite = systemClock.now();
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

/** The events of a streamed run, under their stream names (Server-Sent Events, WebSocket frames). */
export type RunStreamEvent =
  | 'run.created'
  | 'run.started'
  | 'message.delta'
  | 'tool.started'
  | 'tool.completed'
  | (typeof finalEvent)[keyof typeof finalEvent];

/**
 * Executes an admitted inline run here and tells `send` what happens, whatever carries it:
 * `run.created`, `run.started`, then its text deltas and tool calls as they happen, then exactly
 * one final event. Resolves with the run as it ended, once it has (a client that left does not
 * end it).
 */
export async function playRun(
  executor: Executor,
  run: RunRow,
  db: Parameters<typeof getRun>[0],
  send: (event: RunStreamEvent, data: object, tool?: ToolEvent) => void,
): Promise<RunRow> {
  send('run.created', toApiRun(run));
  send('run.started', toApiRun(run));
  const final = await executor.execute(run, {
    onText: (text) => send('message.delta', { run_id: run.id, text }),
    // The stream's data stays { run_id, tool_call_id, name }; the whole event (arguments,
    // result text) goes beside it for carriers that show them (AG-UI).
    onTool: (event) =>
      send(
        event.type === 'started' ? 'tool.started' : 'tool.completed',
        { run_id: run.id, tool_call_id: event.toolCallId, name: event.name },
        event,
      ),
  });
  // Undefined: the run was ended elsewhere (lost, or its end could not be recorded); say how it stands.
  const current = final ?? (await getRun(db, run.tenant, run.id).catch(() => undefined)) ?? run;
  const status = current.status as keyof typeof finalEvent;
  send(finalEvent[status] ?? 'run.failed', toApiRun(current));
  return current;
}

/** Executes an admitted inline run here and streams it as Server-Sent Events (see `playRun`). */
export async function streamRun(
  reply: FastifyReply,
  executor: Executor,
  run: RunRow,
  options: { keepAliveMs?: number; db: Parameters<typeof getRun>[0] },
): Promise<void> {
  const stream = new EventStream(reply, options.keepAliveMs);
  await playRun(executor, run, options.db, (event, data) => stream.send(event, data)).finally(() =>
    stream.end(),
  );
}
