import type { FastifyInstance } from 'fastify';
import { requireRole } from '../http/auth.js';
import { badRequest, notFound, shown } from '../http/errors.js';
import { fillPage, pageLimit } from '../http/paging.js';
import { createThreadBody, listMessagesQuery, threadParams } from '../http/schemas.js';
import {
  createThread,
  getThread,
  listMessages,
  toApiThread,
  type ThreadMessageRow,
} from '../threads/store.js';
import type { RouteContext } from './context.js';

/** A messages cursor: how many of the thread's messages were read, opaque to clients. */
const encodeOffset = (offset: number) => Buffer.from(`m:${offset}`).toString('base64url');
function decodeOffset(raw: string): number | undefined {
  if (!/^[A-Za-z0-9_-]{1,100}$/.test(raw)) return undefined;
  const match = /^m:(\d{1,9})$/.exec(Buffer.from(raw, 'base64url').toString());
  return match ? Number(match[1]) : undefined;
}

const toApiMessage = (m: ThreadMessageRow) => ({
  role: m.role,
  content: m.content,
  run_id: m.run_id,
  created_at: Math.floor(m.created_at),
});

export function threadRoutes(api: FastifyInstance, ctx: RouteContext): void {
  const { db } = ctx;

  api.post<{ Body: { metadata?: Record<string, unknown> } | null }>(
    '/threads',
    { schema: { summary: 'Create a thread', body: createThreadBody } },
    async (request, reply) => {
      requireRole(request.principal, 'member', 'create threads');
      const thread = await createThread(db, request.principal, request.body?.metadata);
      return reply.status(201).send(toApiThread(thread));
    },
  );

  api.get<{ Params: { id: string } }>(
    '/threads/:id',
    { schema: { summary: 'A thread', params: threadParams } },
    async (request) => {
      const thread = await getThread(db, request.principal.tenant, request.params.id);
      // Another tenant's thread does not exist, as far as this token can tell.
      if (!thread) throw notFound(`No thread \`${shown(request.params.id)}\``);
      return toApiThread(thread);
    },
  );

  api.get<{ Params: { id: string }; Querystring: { limit?: string; cursor?: string } }>(
    '/threads/:id/messages',
    {
      schema: {
        summary: "A thread's messages, oldest first",
        params: threadParams,
        querystring: listMessagesQuery,
      },
    },
    async (request) => {
      const thread = await getThread(db, request.principal.tenant, request.params.id);
      if (!thread) throw notFound(`No thread \`${shown(request.params.id)}\``);
      const limit = pageLimit(request.query.limit);
      const cursor = request.query.cursor;
      const offset = cursor === undefined ? 0 : decodeOffset(cursor);
      if (offset === undefined)
        throw badRequest(`Malformed \`cursor\` \`${shown(cursor)}\``, { field: 'cursor' });
      const rows = await listMessages(db, thread.id, { limit: limit + 1, offset });
      const { data, more } = fillPage(rows, limit, toApiMessage);
      return {
        object: 'list',
        data,
        has_more: more,
        next_cursor: more ? encodeOffset(offset + data.length) : null,
      };
    },
  );
}
