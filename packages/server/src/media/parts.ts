import type { SqlClient } from '@sluice/postgres/database';
import type { ChatMessage, ChatPart } from 'sluice';
import { RunRefusedError, invalidInput } from '../runs/refused.js';
import { filesOf } from './store.js';

/**
 * Images in a run's input. A run stores what it was sent: text parts, and image parts that name
 * an uploaded file (`file_id`) or carry a data: URL. A file is read when the run executes, not
 * when it is admitted: the run row stays small (a file is stored once, however many runs use
 * it), and a queued, deferred or scheduled run, or one that outlives a restart, reads it from
 * the database like any process would. Admission checks that the files are there (and the
 * tenant's), so a run that names a missing file is refused before anything is admitted.
 */

export type TextPart = { type: 'text'; text: string };
export type ImagePart = { type: 'input_image'; file_id: string } | { type: 'input_image'; image_url: string };
export type StoredPart = TextPart | ImagePart;
export type StoredMessage = { role: 'user' | 'assistant' | 'system'; content: string | StoredPart[] };

const dataUrl = /^data:(image\/[a-z0-9][a-z0-9.+-]{0,100});base64,([A-Za-z0-9+/]*={0,2})$/i;

/** A data: URL of an image as its mime type and base64 bytes; undefined when it is not one. */
export function parseDataUrl(url: string): { mimeType: string; data: string } | undefined {
  const match = dataUrl.exec(url);
  if (!match || match[2]!.length === 0 || match[2]!.length % 4 !== 0) return undefined;
  return { mimeType: match[1]!.toLowerCase(), data: match[2]! };
}

/**
 * An image part as a run stores it, from what a client sent: an uploaded file's id, or a data:
 * URL. A remote URL is refused: the server never fetches addresses it is given (that would let a
 * tenant make it reach any host, its own network included). `field` names the part.
 */
export function imagePart(
  given: { file_id?: unknown; image_url?: unknown },
  field: string,
  urlField = `${field}.image_url`,
): ImagePart {
  const { file_id: fileId, image_url: url } = given;
  if ((fileId === undefined) === (url === undefined)) {
    throw invalidInput(`Expected \`${field}\` to carry one of \`file_id\` or \`image_url\``, field);
  }
  if (fileId !== undefined) {
    if (typeof fileId !== 'string' || fileId === '' || fileId.length > 200)
      throw invalidInput(
        `Expected \`${field}.file_id\` to be the id of an uploaded file`,
        `${field}.file_id`,
      );
    return { type: 'input_image', file_id: fileId };
  }
  if (typeof url !== 'string') throw invalidInput(`Expected \`${urlField}\` to be a data: URL`, urlField);
  if (/^https?:/i.test(url)) {
    throw invalidInput(
      `\`${urlField}\` is a remote URL, and this server fetches no URL it is given: upload the image (POST /files) and send its \`file_id\`, or send it as a data: URL`,
      urlField,
    );
  }
  if (!parseDataUrl(url)) {
    throw invalidInput(
      `Expected \`${urlField}\` to be a base64 data: URL of an image (data:image/png;base64,...)`,
      urlField,
    );
  }
  return { type: 'input_image', image_url: url };
}

/** The image parts of a stored input, each with where it is (`input.0.content.1`). */
function imagesIn(input: unknown, field: string): { part: ImagePart; field: string; role: string }[] {
  if (!Array.isArray(input)) return [];
  return (input as StoredMessage[]).flatMap((message, i) =>
    typeof message.content === 'string'
      ? []
      : message.content.flatMap((part, j) =>
          part.type === 'input_image'
            ? [{ part, field: `${field}.${i}.content.${j}`, role: message.role }]
            : [],
        ),
  );
}

/**
 * Admission's check of a run's images: in user messages only, for a model that reads images,
 * and every file the tenant's (404 otherwise: another tenant's file is not there).
 */
export async function checkRunImages(
  db: SqlClient,
  tenant: string,
  input: unknown,
  field: string,
  modelTakesImages: boolean,
): Promise<void> {
  const images = imagesIn(input, field);
  if (images.length === 0) return;
  const misplaced = images.find((image) => image.role !== 'user');
  if (misplaced)
    throw invalidInput(
      `\`${misplaced.field}\` is an image in a ${misplaced.role} message; images go in user messages`,
      misplaced.field,
    );
  if (!modelTakesImages) {
    throw invalidInput(
      `\`${images[0]!.field}\` is an image, and this agent's model takes text only (its \`input\` is ['text'])`,
      images[0]!.field,
    );
  }
  const named = images.flatMap((image) =>
    'file_id' in image.part ? [{ ...image, id: image.part.file_id }] : [],
  );
  const found = await filesOf(
    db,
    tenant,
    named.map((image) => image.id),
    false,
  );
  for (const image of named) {
    const file = found.get(image.id);
    if (!file)
      throw new RunRefusedError({ kind: 'file_missing', fileId: image.id, field: `${image.field}.file_id` });
    if (!file.mime_type.startsWith('image/'))
      throw invalidInput(
        `File ${image.id} is ${file.mime_type}, not an image: \`${image.field}\` needs an image file`,
        `${image.field}.file_id`,
      );
  }
}

/** A file a run names was deleted between its admission and its execution. */
export class FileGoneError extends Error {
  override readonly name = 'FileGoneError';
  constructor(readonly fileId: string) {
    super(`File ${fileId} was deleted before the run read it`);
  }
}

/**
 * Stored messages as the agent takes them, with each image's bytes read from the database.
 * A message without images keeps the text form it always had. A deleted file fails the run
 * (`missing: 'fail'`), or, in a thread's history, stands as a line saying so (`'note'`): one
 * deleted file must not end every later turn of its thread.
 */
export async function resolveMessages(
  db: SqlClient,
  tenant: string,
  messages: readonly StoredMessage[],
  missing: 'fail' | 'note',
): Promise<ChatMessage[]> {
  const ids = messages.flatMap((m) =>
    typeof m.content === 'string' ? [] : m.content.flatMap((p) => ('file_id' in p ? [p.file_id] : [])),
  );
  const files = await filesOf(db, tenant, ids, true);
  const toPart = (part: StoredPart): ChatPart => {
    if (part.type === 'text') return part;
    if ('image_url' in part) {
      const parsed = parseDataUrl(part.image_url);
      return parsed
        ? { type: 'image', ...parsed }
        : { type: 'text', text: '(an image that could not be read)' };
    }
    const file = files.get(part.file_id);
    if (file?.content) {
      const data = Buffer.from(file.content.buffer, file.content.byteOffset, file.content.byteLength);
      return { type: 'image', data: data.toString('base64'), mimeType: file.mime_type };
    }
    if (missing === 'fail') throw new FileGoneError(part.file_id);
    return { type: 'text', text: `(image ${part.file_id} was deleted)` };
  };
  return messages.map((m) => {
    if (typeof m.content === 'string') return { role: m.role, content: m.content };
    if (!m.content.some((p) => p.type === 'input_image'))
      return { role: m.role, content: m.content.map((p) => (p as TextPart).text).join('\n') };
    return { role: m.role, content: m.content.map(toPart) };
  });
}

/** Whether a stored input or history holds an image part. */
export const hasImages = (messages: unknown): boolean => imagesIn(messages, '').length > 0;
