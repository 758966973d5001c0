import type { MultipartFile, Multipart } from '@fastify/multipart';
import type { FastifyRequest } from 'fastify';
import { HttpError, shown } from './errors.js';

/**
 * Reading an upload: one multipart part, named `file`, of at most the media limit. A request
 * whose Content-Length is over the limit is refused before any of its body is read; a body
 * without one (chunked) or one that lies is counted as it arrives and cut off as soon as the
 * file passes the limit. Either way the connection is closed rather than the rest read.
 */

/** What the multipart framing (boundaries, part headers) may add to the file's own bytes. */
export const FRAMING_BYTES = 64 * 1024;

export interface Upload {
  content: Buffer;
  mimeType: string;
}

export const mediaMaxBytes = (settings: { mediaMaxSizeMb: number }) => settings.mediaMaxSizeMb * 1024 * 1024;

/** 413 naming the limit and the value: the declared length, or the bytes received so far. */
export function fileTooLarge(maxBytes: number, value: number, declared: boolean): HttpError {
  const mb = maxBytes / (1024 * 1024);
  const what = declared ? `the request declares ${value} bytes` : `more than ${maxBytes} bytes arrived`;
  return new HttpError(
    413,
    'request_too_large',
    `The file is over the limit of ${mb} MB (${maxBytes} bytes, MEDIA_MAX_SIZE_MB): ${what}`,
    { limit: 'media_bytes', limit_value: maxBytes, value, field: 'file' },
    // Answered before the rest of the body is read: the connection goes, not the rest of the upload.
    { connection: 'close' },
  );
}

/** The refusal of a request whose Content-Length already says the file cannot fit. */
export function checkDeclaredLength(request: FastifyRequest, maxBytes: number): void {
  const declared = request.headers['content-length'];
  if (declared === undefined) return;
  const length = Number(declared);
  if (Number.isSafeInteger(length) && length > maxBytes + FRAMING_BYTES) {
    throw fileTooLarge(maxBytes, length, true);
  }
}

const onePart = (message: string) =>
  new HttpError(400, 'invalid_request', message, { field: 'file' }, { connection: 'close' });

/** The parser's own refusals, said in our words, naming the `file` field. */
function parserError(error: unknown, maxBytes: number): unknown {
  if (error instanceof HttpError) return error;
  const { code, message } = error as { code?: string; message?: string };
  switch (code) {
    case 'FST_REQ_FILE_TOO_LARGE':
      return fileTooLarge(maxBytes, maxBytes + 1, false);
    case 'FST_PARTS_LIMIT':
    case 'FST_FILES_LIMIT':
    case 'FST_FIELDS_LIMIT':
      return onePart('Send one multipart part, named `file`, holding the file; this request has more');
    case 'FST_PROTO_VIOLATION':
      return onePart(
        'A multipart part is named after an Object.prototype key (`__proto__`, say); send one part, named `file`',
      );
    case 'FST_MP_PREMATURE_CLOSE':
      return onePart('The request ended before its multipart body was complete');
    default:
      // busboy's refusals of a malformed body ("Unexpected end of form", "Malformed part header"...).
      if (typeof message === 'string' && code === undefined)
        return onePart(`The multipart body is malformed: ${shown(message, 200)}`);
      return error;
  }
}

/** A part's content type as stored: `type/subtype`, lower case, parameters dropped. */
function mimeTypeOf(part: MultipartFile): string {
  const mime = String(part.mimetype ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  if (!/^[a-z0-9][a-z0-9!#$&^_.+-]{0,126}\/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}$/.test(mime)) {
    throw onePart(
      `Expected the \`file\` part's Content-Type to be a media type such as image/png, got \`${shown(part.mimetype)}\``,
    );
  }
  return mime;
}

async function contentOf(part: MultipartFile, maxBytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of part.file) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) throw fileTooLarge(maxBytes, size, false);
    chunks.push(chunk as Buffer);
  }
  if (part.file.truncated) throw fileTooLarge(maxBytes, size, false);
  return Buffer.concat(chunks, size);
}

/** Reads the one `file` part of a multipart request (see the module's comment). */
export async function readUpload(request: FastifyRequest, maxBytes: number): Promise<Upload> {
  if (!request.isMultipart()) {
    throw new HttpError(
      415,
      'unsupported_media_type',
      'Send the file as multipart/form-data, in one part named `file`',
      { field: 'file' },
      { connection: 'close' },
    );
  }
  let upload: Upload | undefined;
  try {
    // One more byte than the limit, so that a file of exactly the limit is not cut.
    const limits = {
      fileSize: maxBytes + 1,
      files: 1,
      fields: 1,
      fieldSize: 1024,
      parts: 1,
      headerPairs: 20,
    };
    for await (const part of request.parts({ limits }) as AsyncIterable<Multipart>) {
      if (part.type !== 'file' || part.fieldname !== 'file') {
        throw onePart(
          `Unexpected multipart part \`${shown(part.fieldname, 100)}\`: send one part, named \`file\`, holding the file`,
        );
      }
      const mimeType = mimeTypeOf(part);
      upload = { mimeType, content: await contentOf(part, maxBytes) };
    }
  } catch (error) {
    throw parserError(error, maxBytes);
  }
  if (!upload) throw onePart('Expected a multipart part named `file` holding the file; the body has none');
  if (upload.content.length === 0) throw onePart('The `file` part is empty');
  return upload;
}
