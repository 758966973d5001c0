import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import type { ToolEvent } from 'sluice';
import { systemClock } from 'sluice/concurrency';
import { settingDefaults } from '../settings.js';
import type { Executor } from '../runs/executor.js';
import { getRun, type RunRow } from '../runs/store.js';
import { createdEvent, type RunStreamEvent } from '../streams/index.js';

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

  /** An event; with `id`, a client that reconnects sends it back as Last-Event-ID. */
  send(event: string, data: unknown, id?: number): void {
    const idLine = id === undefined ? '' : `id: ${id}\n`;
    this.#write(`${idLine}event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
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

export type { RunStreamEvent };

/**
 * Executes an admitted inline run here and tells `send` what happens, whatever carries it:
 * `run.created`, `run.started`, then its text deltas and tool calls as they happen, then exactly
 * one final event, each with its id in the run's stored stream. Resolves with the run as it
 * ended, once it has (a client that left does not end it).
 */
export async function playRun(
  executor: Executor,
  run: RunRow,
  db: Parameters<typeof getRun>[0],
  send: (event: RunStreamEvent, data: object, tool: ToolEvent | undefined, id: number) => void,
): Promise<RunRow> {
  // Stored at admission (runs/submission.ts); sent here as it was stored.
  const created = createdEvent(run);
  send(created.event, created.data, undefined, created.id);
  const final = await executor.execute(run, {
    onEvent: (event, tool) => send(event.event, event.data, tool, event.id),
  });
  return final ?? (await getRun(db, run.tenant, run.id).catch(() => undefined)) ?? run;
}

/** Executes an admitted inline run here and streams it as Server-Sent Events (see `playRun`). */
export async function streamRun(
  reply: FastifyReply,
  executor: Executor,
  run: RunRow,
  options: { keepAliveMs?: number; db: Parameters<typeof getRun>[0] },
): Promise<void> {
  const stream = new EventStream(reply, options.keepAliveMs);
  await playRun(executor, run, options.db, (event, data, _tool, id) => stream.send(event, data, id)).finally(
    () => stream.end(),
  );
}
