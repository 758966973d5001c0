import multipart from '@fastify/multipart';
import type { FastifyInstance } from 'fastify';
import { requireRole } from '../http/auth.js';
import { HttpError, shown } from '../http/errors.js';
import { deleteFile, getFile, getFileContent, insertFile, type FileMeta } from '../media/store.js';
import { checkDeclaredLength, mediaMaxBytes, readUpload } from '../http/upload.js';
import type { RouteContext } from './context.js';

const fileParams = {
  type: 'object',
  required: ['id'],
  properties: { id: { type: 'string', maxLength: 200 } },
} as const;

export const toApiFile = (f: FileMeta) => ({
  id: f.id,
  object: 'file' as const,
  bytes: f.bytes,
  mime_type: f.mime_type,
  created_at: Math.floor(f.created_at),
});

// Another tenant's file does not exist, as far as this token can tell.
const noFile = (id: string) => new HttpError(404, 'not_found', `No file \`${shown(id)}\``, { field: 'id' });

/**
 * `POST /files` (multipart, one part named `file`), `GET /files/:id`, `GET /files/:id/content`
 * and `DELETE /files/:id`. The multipart parser is registered here only: other routes keep
 * taking JSON alone.
 */
export async function fileRoutes(api: FastifyInstance, ctx: RouteContext): Promise<void> {
  const { db } = ctx;
  const maxBytes = mediaMaxBytes(ctx.settings);
  await api.register(multipart, { limits: { fileSize: maxBytes + 1 } });

  api.post(
    '/files',
    {
      schema: { summary: 'Upload a file (multipart/form-data, one part named `file`)' },
      // After authentication, before the body is read: a declared length over the limit is refused unread.
      preParsing: (request, _reply, payload, done) => {
        try {
          requireRole(request.principal, 'member', 'upload files');
          checkDeclaredLength(request, maxBytes);
        } catch (error) {
          done(error as Error);
          return;
        }
        done(null, payload);
      },
    },
    async (request, reply) => {
      const upload = await readUpload(request, maxBytes);
      const file = await insertFile(db, request.principal, upload);
      return reply.status(201).send(toApiFile(file));
    },
  );

  api.get<{ Params: { id: string } }>(
    '/files/:id',
    { schema: { summary: "A file's metadata", params: fileParams } },
    async (request) => {
      const file = await getFile(db, request.principal.tenant, request.params.id);
      if (!file) throw noFile(request.params.id);
      return toApiFile(file);
    },
  );

  api.get<{ Params: { id: string } }>(
    '/files/:id/content',
    { schema: { summary: "A file's bytes, with its mime type", params: fileParams } },
    async (request, reply) => {
      const file = await getFileContent(db, request.principal.tenant, request.params.id);
      if (!file) throw noFile(request.params.id);
      const bytes = Buffer.from(file.content.buffer, file.content.byteOffset, file.content.byteLength);
      // Served as a download of the stated type, never rendered as a page of this origin.
      return reply
        .type(file.mime_type)
        .header('content-disposition', 'attachment')
        .header('x-content-type-options', 'nosniff')
        .send(bytes);
    },
  );

  api.delete<{ Params: { id: string } }>(
    '/files/:id',
    { schema: { summary: 'Delete a file', params: fileParams } },
    async (request) => {
      requireRole(request.principal, 'member', 'delete files');
      const id = request.params.id;
      if (!(await deleteFile(db, request.principal.tenant, id))) throw noFile(id);
      return { id, object: 'file', deleted: true };
    },
  );
}
