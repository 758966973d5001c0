import { connect } from 'node:net';

/** One HTTP/1.1 response as it came off the socket. */
export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

export interface RawExchange {
  /** Responses in the order they came; empty when the server closed without answering. */
  responses: RawResponse[];
  /** Bytes that did not parse as a response (should be none). */
  garbage: string;
}

/**
 * Sends bytes exactly as given over a fresh TCP connection (fetch and node:http refuse to send
 * a lying Content-Length, a NUL in a path or a bad method) and reads until the server closes.
 * `halfClose` ends the writing side after the bytes: the only way to make a server that waits
 * for a promised body give up without a timer.
 */
export function rawExchange(
  port: number,
  bytes: Buffer,
  options: { halfClose?: boolean; timeoutMs?: number; head?: boolean } = {},
): Promise<RawExchange> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    const chunks: Buffer[] = [];
    // A safety net against a hung server, far above any answer on a loaded machine.
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no end of the exchange within ${options.timeoutMs ?? 60_000} ms`));
    }, options.timeoutMs ?? 60_000);
    socket.on('connect', () => {
      socket.write(bytes);
      if (options.halfClose) socket.end();
    });
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    // A reset after the server answered and closed is fine: what it wrote was read.
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(parseResponses(Buffer.concat(chunks), options.head));
    });
  });
}

/**
 * Splits what a server wrote into responses (Content-Length, chunked, or until the end). A 1xx
 * response has no body, nor has the first response to a HEAD request.
 */
export function parseResponses(data: Buffer, head = false): RawExchange {
  const responses: RawResponse[] = [];
  let at = 0;
  while (at < data.length) {
    const headEnd = data.indexOf('\r\n\r\n', at);
    if (headEnd < 0) break;
    const [statusLine, ...lines] = data.subarray(at, headEnd).toString('latin1').split('\r\n');
    const status = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine ?? '');
    if (!status) break;
    const headers: Record<string, string> = {};
    for (const line of lines) {
      const colon = line.indexOf(':');
      if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    let bodyStart = headEnd + 4;
    let body: Buffer;
    const code = Number(status[1]);
    if (code < 200 || (head && responses.length === 0)) {
      body = Buffer.alloc(0);
      at = bodyStart;
    } else if (headers['content-length'] !== undefined) {
      const length = Number(headers['content-length']);
      body = data.subarray(bodyStart, bodyStart + length);
      at = bodyStart + length;
    } else if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
      const parts: Buffer[] = [];
      for (;;) {
        const lineEnd = data.indexOf('\r\n', bodyStart);
        if (lineEnd < 0) break;
        const size = parseInt(data.subarray(bodyStart, lineEnd).toString('latin1'), 16);
        if (!Number.isFinite(size) || size === 0) {
          bodyStart = lineEnd + 4;
          break;
        }
        parts.push(data.subarray(lineEnd + 2, lineEnd + 2 + size));
        bodyStart = lineEnd + 2 + size + 2;
      }
      body = Buffer.concat(parts);
      at = bodyStart;
    } else {
      body = data.subarray(bodyStart);
      at = data.length;
    }
    responses.push({ status: code, headers, body: body.toString('utf8') });
  }
  return { responses, garbage: data.subarray(at).toString('latin1') };
}

/** The bytes of a request: a request line, headers in the order given (duplicates allowed), a body. */
export function requestBytes(
  method: string,
  target: string,
  headers: [string, string][],
  body?: Buffer | string,
  version = 'HTTP/1.1',
): Buffer {
  const head = `${method} ${target} ${version}\r\n${headers.map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`;
  // latin1: each char of the head is one byte, so a test can put any byte in a path or header.
  return Buffer.concat([
    Buffer.from(head, 'latin1'),
    body === undefined ? Buffer.alloc(0) : Buffer.from(body),
  ]);
}
