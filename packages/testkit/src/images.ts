import { createHash } from 'node:crypto';
import type { StandInImage } from './types.js';

/**
 * The images of a request's user messages, in order, from either wire protocol: OpenAI's
 * `image_url` parts (data: URLs) and Anthropic's base64 `image` blocks. An image by remote URL
 * is reported with its URL and no bytes (a provider would fetch it; the stand-in does not).
 */
export function imagesOf(protocol: 'openai' | 'anthropic', body: Record<string, unknown>): StandInImage[] {
  const messages = Array.isArray(body.messages)
    ? (body.messages as { role?: unknown; content?: unknown }[])
    : [];
  const images: StandInImage[] = [];
  for (const message of messages) {
    if (message.role !== 'user' || !Array.isArray(message.content)) continue;
    for (const part of message.content as Record<string, unknown>[]) {
      const image = protocol === 'openai' ? fromOpenAi(part) : fromAnthropic(part);
      if (image) images.push(image);
    }
  }
  return images;
}

function fromOpenAi(part: Record<string, unknown>): StandInImage | undefined {
  if (part.type !== 'image_url') return undefined;
  const url = String((part.image_url as { url?: unknown } | undefined)?.url ?? '');
  const match = /^data:([^;,]+);base64,(.*)$/s.exec(url);
  return match ? image(match[1]!, match[2]!) : { mimeType: '', data: '', bytes: 0, sha256: '', url };
}

function fromAnthropic(part: Record<string, unknown>): StandInImage | undefined {
  if (part.type !== 'image') return undefined;
  const source = (part.source ?? {}) as {
    type?: unknown;
    media_type?: unknown;
    data?: unknown;
    url?: unknown;
  };
  if (source.type === 'base64') return image(String(source.media_type), String(source.data));
  return { mimeType: '', data: '', bytes: 0, sha256: '', url: String(source.url ?? '') };
}

function image(mimeType: string, data: string): StandInImage {
  const bytes = Buffer.from(data, 'base64');
  return { mimeType, data, bytes: bytes.length, sha256: createHash('sha256').update(bytes).digest('hex') };
}

/** How the default reply mentions the images it was sent: ` [image image/png, 68 bytes]` each. */
export const imageNotes = (images: readonly StandInImage[]): string =>
  images.map((i) => ` [image ${i.mimeType || i.url}, ${i.bytes} bytes]`).join('');
