import { createHash } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { parseResponses, type RawResponse } from '../http/raw-client.js';

// Uploads as clients send them: `fetch` with a FormData (what a browser or Node sends), and a
// raw socket for what fetch will not send (a lying Content-Length, a body that never ends).

/** A small PNG (1x1, red), the bytes an image test sends and expects the provider to get. */
export const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==',
  'base64',
);

export const sha256 = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');

/** `POST /files` with one part named `name` (default `file`) through fetch. */
export async function upload(
  url: string,
  token: string,
  bytes: Buffer,
  options: { type?: string; name?: string } = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const form = new FormData();
  form.append(options.name ?? 'file', new Blob([bytes], { type: options.type ?? 'image/png' }), 'a.png');
  const r = await fetch(`${url}/api/client/v1/files`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}` },
    body: form,
  });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

export const BOUNDARY = 'sluiceTestBoundary7MA4YWxk';

/** One multipart part: its headers and content, framed by the boundary. */
export function part(disposition: string, content: Buffer | string, type = 'image/png'): Buffer {
  return Buffer.concat([
    Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: ${disposition}\r\nContent-Type: ${type}\r\n\r\n`),
    Buffer.from(content),
    Buffer.from('\r\n'),
  ]);
}

export const closing = Buffer.from(`--${BOUNDARY}--\r\n`);

/** The head of a `POST /files` request, with the given length header (or chunked). */
export function uploadHead(token: string, length: number | 'chunked', contentType?: string): Buffer {
  const lines = [
    'POST /api/client/v1/files HTTP/1.1',
    'Host: 127.0.0.1',
    `Authorization: Bearer ${token}`,
    `Content-Type: ${contentType ?? `multipart/form-data; boundary=${BOUNDARY}`}`,
    length === 'chunked' ? 'Transfer-Encoding: chunked' : `Content-Length: ${length}`,
  ];
  return Buffer.from(`${lines.join('\r\n')}\r\n\r\n`);
}

export interface Streamed {
  response: RawResponse | undefined;
  /** Bytes of body written before the server's answer came. */
  sentBeforeAnswer: number;
  /** Whether the whole body had been written when the answer came. */
  finished: boolean;
}

/**
 * Writes `head`, then `chunks()` one at a time (each once the last has been taken by the
 * socket), stopping as soon as the server answers; resolves when the server closes the
 * connection. The client never ends the body on its own unless `chunks` runs out.
 */
export function streamUpload(port: number, head: Buffer, chunks: Iterable<Buffer>): Promise<Streamed> {
  return new Promise((resolve, reject) => {
    const socket: Socket = connect({ host: '127.0.0.1', port });
    const received: Buffer[] = [];
    let sent = 0;
    let sentBeforeAnswer = -1;
    let finished = false;
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error('the server neither answered nor closed within 30 s'));
    }, 30_000);
    socket.on('data', (chunk: Buffer) => {
      if (sentBeforeAnswer < 0) sentBeforeAnswer = sent;
      received.push(chunk);
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      const { responses } = parseResponses(Buffer.concat(received));
      resolve({ response: responses[0], sentBeforeAnswer, finished });
    });
    socket.on('connect', () => {
      socket.write(head);
      const iterator = chunks[Symbol.iterator]();
      const next = () => {
        if (sentBeforeAnswer >= 0 || socket.destroyed) return;
        const item = iterator.next();
        if (item.done) {
          finished = true;
          return;
        }
        sent += item.value.length;
        socket.write(item.value, (error) => {
          if (!error) next();
        });
      };
      next();
    });
  });
}
