import { SluiceError } from './errors.js';
import { sleep, type CallOptions, type Transport } from './http.js';
import { readSse } from './sse.js';
import type { CreateRunBody, ListRunsQuery, Page, ResumeBody, Run, StreamEvent } from './types.js';

const enc = encodeURIComponent;
const settled = (run: Run) =>
  run.status === 'succeeded' ||
  run.status === 'failed' ||
  run.status === 'canceled' ||
  run.status === 'requires_action';
const endEvents = new Set(['run.completed', 'run.failed', 'run.canceled', 'run.requires_action']);

/** How long one `runs.wait` call asks the server to hold it; the server caps it at its own window. */
const WAIT_WINDOW_MS = 30_000;
/** Reconnections of one stream in a row without an event in between. */
const MAX_RECONNECTS = 5;

/** The run calls of a client (see `createClient`). */
export function runCalls(t: Transport) {
  const get = (id: string, options?: CallOptions) =>
    t.json<Run>('GET', `/agents/runs/${enc(id)}`, undefined, options);
  return {
    /** Creates a run (`POST /agents/:agent/runs`): the run as the server answers (200 when it ended, 202 queued). */
    create: (agent: string, body: CreateRunBody, options?: CallOptions) =>
      t.json<Run>('POST', `/agents/${enc(agent)}/runs`, body, options),
    get,
    /** A page of the tenant's runs, oldest first. */
    list: (query: ListRunsQuery = {}, options?: CallOptions) => {
      const search = new URLSearchParams(
        Object.entries(query).filter((e): e is [string, string] => typeof e[1] === 'string'),
      ).toString();
      return t.json<Page<Run>>('GET', `/agents/runs${search ? `?${search}` : ''}`, undefined, options);
    },
    /** Cancels a run; resolves with the run (final, or still stopping on its process). */
    cancel: (id: string, options?: CallOptions) =>
      t.json<Run>('POST', `/agents/runs/${enc(id)}/cancel`, undefined, options),
    /** Answers a paused run's approvals; it continues queued. */
    resume: (id: string, body: ResumeBody, options?: CallOptions) =>
      t.json<Run>('POST', `/agents/runs/${enc(id)}/resume`, body, options),
    /**
     * Resolves once the run is final or waits for approvals: each call is held by the server
     * (up to its sync window) until the run settles; a server that answers at once is polled.
     */
    async wait(id: string, options: CallOptions = {}): Promise<Run> {
      for (let pause = 250; ; pause = Math.min(pause * 2, 5_000)) {
        const asked = Date.now();
        const run = await t.json<Run>(
          'GET',
          `/agents/runs/${enc(id)}?wait_ms=${WAIT_WINDOW_MS}`,
          undefined,
          options,
        );
        if (settled(run)) return run;
        // Held for the window: ask again at once. Answered at once: the server does not hold, poll.
        if (Date.now() - asked < WAIT_WINDOW_MS / 2) await sleep(pause, options.signal);
      }
    },
    /**
     * Creates a streamed run and yields its events. A dropped connection is resumed from the
     * last event seen (`GET /agents/runs/:id/events` with `Last-Event-ID`, on whichever server
     * answers), so each event comes once, in order, until the one that ends the run's stream.
     */
    stream(agent: string, body: CreateRunBody, options: CallOptions = {}): AsyncIterable<StreamEvent> {
      return {
        [Symbol.asyncIterator]: () =>
          follow(
            t,
            () => t.send('POST', `/agents/${enc(agent)}/runs`, { ...body, stream: true }, options),
            options,
          ),
      };
    },
    /** The events of an existing run after `after` (0: from `run.created`), resumed the same way. */
    events(id: string, options: CallOptions & { after?: number } = {}): AsyncIterable<StreamEvent> {
      return {
        [Symbol.asyncIterator]: () =>
          follow(t, undefined, options, { runId: id, lastId: options.after ?? 0 }),
      };
    },
  };
}

async function* follow(
  t: Transport,
  open: (() => Promise<Response>) | undefined,
  options: CallOptions,
  from: { runId?: string; lastId: number } = { lastId: 0 },
): AsyncGenerator<StreamEvent> {
  let { runId, lastId } = from;
  const reopen = () =>
    t.send('GET', `/agents/runs/${enc(runId!)}/events`, undefined, {
      signal: options.signal,
      headers: { 'last-event-id': String(lastId) },
    });
  let response = await (open ?? reopen)();
  for (let failures = 0; ;) {
    try {
      for await (const raw of readSse(response.body!)) {
        const id = Number(raw.id);
        if (raw.id !== undefined && id <= lastId) continue;
        const event = { id, event: raw.event, data: JSON.parse(raw.data) } as StreamEvent;
        if (event.event === 'run.created') runId = event.data.id;
        lastId = Number.isFinite(id) ? id : lastId;
        failures = 0;
        yield event;
        if (endEvents.has(event.event)) return;
      }
    } catch (error) {
      if (options.signal?.aborted || runId === undefined) throw error;
    }
    // The body ended (or broke) before the run's last event: the connection dropped.
    if (runId === undefined)
      throw new SluiceError(502, {
        type: 'stream_lost',
        message: 'The stream ended before its run was created',
      });
    if (failures++ >= MAX_RECONNECTS)
      throw new SluiceError(502, {
        type: 'stream_lost',
        message: `The stream of run ${runId} dropped ${failures} times in a row`,
      });
    await sleep(100 * 2 ** (failures - 1), options.signal);
    response = await reopen();
  }
}
