import type { FastifyInstance } from 'fastify';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { clientGone } from '../http/client-gone.js';
import { runEventsQuery, runParams } from '../http/schemas.js';
import { isFinal } from '../runs/states.js';
import { getRun, isRunId } from '../runs/store.js';
import { eventsExpired, newestEvent } from '../streams/queries.js';
import type { RouteContext } from './context.js';
import { EventStream } from './stream-run.js';

/** Event ids are whole numbers from 1; 0 (or none) asks for the stream from its start. */
const eventId = /^(0|[1-9][0-9]{0,9})$/;

/** The id to read after, from `Last-Event-ID` (a reconnecting EventSource sends it) or `?after=`. */
function afterOf(header: string | string[] | undefined, query: string | undefined): number {
  const fromHeader = Array.isArray(header) ? header[0] : header;
  for (const [field, raw] of [
    ['Last-Event-ID', fromHeader],
    ['after', query],
  ] as const) {
    if (raw !== undefined && !eventId.test(raw.trim()))
      throw badRequest(`Expected \`${field}\` to be an event id (a whole number), got \`${shown(raw)}\``, {
        field,
      });
  }
  if (fromHeader !== undefined && query !== undefined && Number(fromHeader.trim()) !== Number(query))
    throw badRequest(
      `\`Last-Event-ID\` (${shown(fromHeader)}) and \`after\` (${shown(query)}) name different events; send one`,
      { field: 'after' },
    );
  return Number((fromHeader ?? query ?? '0').trim());
}

/**
 * `GET /agents/runs/:id/events`: the run's events after `Last-Event-ID` (or `?after=`), or all
 * of them from `run.created`, then the rest as they come, until the event that ends the stream.
 * Any process answers for any run: the events are read from the store. A run that ended more
 * than SLUICE_STREAM_RETENTION_MS ago gets 410; an id after the end of an ended run, 400.
 */
export function runEventsRoute(api: FastifyInstance, ctx: RouteContext): void {
  api.get<{ Params: { id: string }; Querystring: { after?: string } }>(
    '/agents/runs/:id/events',
    {
      schema: {
        summary: "A run's events (Server-Sent Events), resumable",
        params: runParams,
        querystring: runEventsQuery,
      },
    },
    async (request, reply) => {
      const id = request.params.id;
      const after = afterOf(request.headers['last-event-id'], request.query.after);
      const tenant = request.principal.tenant;
      const run = isRunId(id) ? await getRun(ctx.db, tenant, id) : undefined;
      // Another tenant's run does not exist, as far as this token can tell.
      if (!run) throw notFound(`No run \`${shown(id)}\``);
      if (await eventsExpired(ctx.db, run.id, ctx.settings.streamRetentionMs)) {
        throw new HttpError(
          410,
          'run_events_expired',
          `Run ${run.id} ended more than SLUICE_STREAM_RETENTION_MS (${ctx.settings.streamRetentionMs} ms) ago; its events are gone`,
          { run_id: run.id },
        );
      }
      if (after > 0 && isFinal(run.status)) {
        const newest = await newestEvent(ctx.db, run.id);
        // One past the newest is the last event a reader may have made from the row.
        if (after > (newest?.id ?? 0) + 1)
          throw badRequest(`Run ${run.id} has no event ${after}; its last is ${newest?.id ?? 0}`, {
            field: request.query.after === undefined ? 'Last-Event-ID' : 'after',
          });
      }
      const signal = clientGone(reply);
      const stream = new EventStream(reply, ctx.settings.streamKeepAliveMs);
      try {
        for await (const event of ctx.executor.streams.follow(tenant, run.id, after, signal)) {
          stream.send(event.event, event.data, event.id);
        }
      } catch (error) {
        // The headers are sent: a database that went away ends the stream; the client resumes.
        request.log.warn({ error: String(error), run: run.id }, 'run event stream ended early');
      } finally {
        stream.end();
      }
      return reply;
    },
  );
}
