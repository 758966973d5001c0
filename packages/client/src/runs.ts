import { SluiceError } from './errors.js';
import { segment, sleep, type CallOptions, type Transport } from './http.js';
import { readSse, type SseFrame } from './sse.js';
import type { CreateRunBody, ListRunsQuery, Page, ResumeBody, Run, StreamEvent } from './types.js';

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
/** The pause before the first of those reconnections, doubled for each next one, unless the server's `retry:` says. */
const RECONNECT_MS = 100;
/** The longest pause before a reconnection, whatever `retry:` asks. */
const MAX_RECONNECT_MS = 30_000;

/** The run calls of a client (see `createClient`). */
export function runCalls(t: Transport) {
  const get = async (id: string, options?: CallOptions) =>
    t.json<Run>('GET', `/agents/runs/${segment('id', id)}`, undefined, options);
  return {
    /** Creates a run (`POST /agents/:agent/runs`): the run as the server answers (200 when it ended, 202 queued). */
    create: async (agent: string, body: CreateRunBody, options?: CallOptions) =>
      t.json<Run>('POST', `/agents/${segment('agent', agent)}/runs`, body, options),
    get,
    /** A page of the tenant's runs, oldest first. */
    list: async (query: ListRunsQuery = {}, options?: CallOptions) => {
      const search = new URLSearchParams();
      for (const [name, value] of Object.entries(query) as [string, unknown][]) {
        if (value === undefined || value === null) continue;
        // A number (`limit: 2`) is sent as one; anything else would be dropped without a word.
        if (typeof value !== 'string' && typeof value !== 'number')
          throw new TypeError(
            `Expected \`${name}\` of runs.list to be a string or a number, got ${typeof value}`,
          );
        search.set(name, String(value));
      }
      const q = search.toString();
      return t.json<Page<Run>>('GET', `/agents/runs${q ? `?${q}` : ''}`, undefined, options);
    },
    /** Cancels a run; resolves with the run (final, or still stopping on its process). */
    cancel: async (id: string, options?: CallOptions) =>
      t.json<Run>('POST', `/agents/runs/${segment('id', id)}/cancel`, undefined, options),
    /** Answers a paused run's approvals; it continues queued. */
    resume: async (id: string, body: ResumeBody, options?: CallOptions) =>
      t.json<Run>('POST', `/agents/runs/${segment('id', id)}/resume`, body, options),
    /**
     * Resolves once the run is final or waits for approvals: each call is held by the server
     * (up to its sync window) until the run settles; a server that answers at once is polled.
     */
    async wait(id: string, options: CallOptions = {}): Promise<Run> {
      const path = `/agents/runs/${segment('id', id)}?wait_ms=${WAIT_WINDOW_MS}`;
      for (let pause = 250; ; pause = Math.min(pause * 2, 5_000)) {
        const asked = Date.now();
        const run = await t.json<Run>('GET', path, undefined, options);
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
            () =>
              t.send('POST', `/agents/${segment('agent', agent)}/runs`, { ...body, stream: true }, options),
            options,
          ),
      };
    },
    /** The events of an existing run after `after` (0: from `run.created`), resumed the same way. */
    events(id: string, options: CallOptions & { after?: number } = {}): AsyncIterable<StreamEvent> {
      const after = options.after ?? 0;
      if (!Number.isSafeInteger(after) || after < 0)
        throw new TypeError(
          `Expected \`after\` to be an event id (a whole number >= 0), got \`${String(after)}\``,
        );
      segment('id', id);
      return {
        [Symbol.asyncIterator]: () => follow(t, undefined, options, { runId: id, lastId: after }),
      };
    },
  };
}

/** Why a stream cannot be read: a SluiceError of the response it came in. */
const invalid = (response: Response, message: string, cause?: unknown) =>
  new SluiceError(response.status, { type: 'invalid_response', message }, undefined, { cause });

/** A response that must be an event stream: anything else (a JSON run, a portal's page) is refused. */
async function eventStreamOf(response: Response): Promise<ReadableStream<Uint8Array>> {
  const type = response.headers.get('content-type') ?? '';
  if (response.body && /^text\/event-stream\s*(;|$)/i.test(type)) return response.body;
  await response.body?.cancel().catch(() => {});
  throw invalid(
    response,
    `Expected the run's events as text/event-stream, got ${response.status} ${type || 'without a content-type'}`,
  );
}

/** A frame with data as a run's event; a run's events carry whole-number ids and JSON data. */
function eventOf(
  response: Response,
  frame: SseFrame & { data: string },
  runId: string | undefined,
): StreamEvent {
  const of = runId === undefined ? '' : ` of run ${runId}`;
  if (frame.id === undefined || !/^\d+$/.test(frame.id))
    throw invalid(
      response,
      `Event \`${frame.event}\`${of} has no event id (\`id:\` ${frame.id ?? 'missing'})`,
    );
  try {
    return { id: Number(frame.id), event: frame.event, data: JSON.parse(frame.data) } as StreamEvent;
  } catch (error) {
    throw invalid(response, `Event ${frame.id} (\`${frame.event}\`)${of} has data that is not JSON`, error);
  }
}

/**
 * Reads a run's events from `open` (or from the events route) and, when the connection drops
 * before the event that ends the stream, reconnects with Last-Event-ID: the frames already
 * seen are skipped, so each event is yielded once. At most MAX_RECONNECTS reconnections in a
 * row without a new event, each after a longer pause (the server's `retry:` sets the first);
 * then a SluiceError `stream_lost` whose cause is the last failure. An answer that is not an
 * event stream, an event without an id or with data that is not JSON, and an error status of
 * the events route are thrown at once.
 */
async function* follow(
  t: Transport,
  open: (() => Promise<Response>) | undefined,
  options: CallOptions,
  from: { runId?: string; lastId: number } = { lastId: 0 },
): AsyncGenerator<StreamEvent> {
  const signal = options.signal;
  let { runId, lastId } = from;
  let pause = RECONNECT_MS;
  const reopen = () =>
    t.send('GET', `/agents/runs/${segment('id', runId)}/events`, undefined, {
      signal,
      headers: { 'last-event-id': String(lastId) },
    });
  let response: Response | undefined = await (open ?? reopen)();
  // Why the last connection ended, when it broke rather than ended.
  let lost: unknown;
  for (let failures = 0; ;) {
    if (response) {
      lost = undefined;
      const body = await eventStreamOf(response);
      try {
        for await (const frame of readSse(body)) {
          if (frame.retry !== undefined) pause = Math.min(frame.retry, MAX_RECONNECT_MS);
          if (frame.data === undefined) {
            // An id on a frame without data moves the resume point, as EventSource's lastEventId.
            if (frame.id !== undefined && /^\d+$/.test(frame.id)) lastId = Math.max(lastId, Number(frame.id));
            continue;
          }
          const event = eventOf(response, frame as SseFrame & { data: string }, runId);
          if (event.id <= lastId) continue;
          if (event.event === 'run.created' && typeof event.data.id === 'string') runId ??= event.data.id;
          lastId = event.id;
          failures = 0;
          yield event;
          if (endEvents.has(event.event)) return;
        }
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (error instanceof SluiceError) throw error;
        lost = error;
      }
    }
    // The body ended (or broke) before the run's last event: the connection dropped.
    if (runId === undefined)
      throw new SluiceError(
        502,
        { type: 'stream_lost', message: 'The stream ended before its run was created' },
        undefined,
        { cause: lost },
      );
    if (failures++ >= MAX_RECONNECTS)
      throw new SluiceError(
        502,
        {
          type: 'stream_lost',
          message: `The stream of run ${runId} dropped ${failures} times in a row (last event ${lastId})`,
        },
        undefined,
        { cause: lost },
      );
    await sleep(Math.min(pause * 2 ** (failures - 1), MAX_RECONNECT_MS), signal);
    try {
      response = await reopen();
    } catch (error) {
      // A refused or reset connection is one more failure; an answer of the server is not.
      if (signal?.aborted) throw signal.reason;
      if (error instanceof SluiceError) throw error;
      response = undefined;
      lost = error;
    }
  }
}
