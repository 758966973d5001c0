import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { startTestServer, type Body } from '../helpers.js';
import { parseResponses } from '../http/raw-client.js';

/**
 * Sends `head` (and nothing more) and resolves with the first whole response, while the socket
 * is still open: the server must answer without waiting for the body it was promised.
 */
function answerToHead(
  port: number,
  head: string,
): Promise<{ status: number; body: Body; bytesSent: number }> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    let data = Buffer.alloc(0);
    socket.on('connect', () => socket.write(head));
    socket.on('error', reject);
    socket.on('data', (chunk: Buffer) => {
      data = Buffer.concat([data, chunk]);
      const [response] = parseResponses(data).responses;
      if (response && Buffer.byteLength(response.body) === Number(response.headers['content-length'])) {
        socket.destroy();
        resolve({
          status: response.status,
          body: JSON.parse(response.body) as Body,
          bytesSent: socket.bytesWritten,
        });
      }
    });
    socket.on('close', () => reject(new Error('closed without a whole answer')));
  });
}

describe('fixed request limits', () => {
  it('a declared Content-Length of 20 MB with no body sent gets 413 request_too_large at once, before any of it is read', async () => {
    const t = await startTestServer();
    const port = Number(new URL(t.server.url).port);
    const answer = await answerToHead(
      port,
      `POST /api/client/v1/agents/echo/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.admin}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${20 * 1024 * 1024}\r\n\r\n`,
    );
    expect(answer.status).toBe(413);
    expect(answer.body.error).toMatchObject({ type: 'request_too_large', code: 'request_too_large' });
    expect(answer.body.error.message).toMatch(/10485760|10 MB/);
    // Nothing was admitted.
    expect((await t.call('GET', '/agents/runs')).body.data).toEqual([]);
  });

  it('a streamed (chunked) body is cut off once it passes 10 MB: 413, and the server stays up', async () => {
    const t = await startTestServer();
    const big = JSON.stringify({ input: 'x'.repeat(11 * 1024 * 1024) });
    const response = await fetch(`${t.server.url}/api/client/v1/agents/echo/runs`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.admin}`, 'content-type': 'application/json' },
      // A stream has no Content-Length: the limit is found while reading.
      body: new Blob([big]).stream(),
      duplex: 'half',
    } as RequestInit);
    expect(response.status).toBe(413);
    expect(((await response.json()) as Body).error.code).toBe('request_too_large');
    expect((await t.call('POST', '/agents/echo/runs', { input: 'still here' })).body.status).toBe(
      'succeeded',
    );
  });

  it.each([
    [
      'messages',
      { messages: Array.from({ length: 501 }, () => ({ role: 'user', content: 'm' })) },
      'messages',
      500,
      501,
    ],
    [
      'content_blocks',
      {
        messages: [
          { role: 'user', content: Array.from({ length: 101 }, () => ({ type: 'text', text: 'b' })) },
        ],
      },
      'messages.0.content',
      100,
      101,
    ],
    ['text_chars', { input: 'c'.repeat(1_000_001) }, 'input', 1_000_000, 1_000_001],
    [
      'text_chars',
      {
        messages: [
          { role: 'user', content: 'c'.repeat(600_000) },
          { role: 'assistant', content: 'd'.repeat(400_001) },
        ],
      },
      'messages',
      1_000_000,
      1_000_001,
    ],
  ] as const)(
    '%s: one past the limit is 413 request_too_large naming the limit, its value and the count',
    async (limit, body, field, max, value) => {
      const t = await startTestServer();
      for (const extra of [{}, { stream: true }]) {
        const r = await t.call('POST', '/agents/echo/runs', { ...body, ...extra });
        expect(r.status).toBe(413);
        expect(r.body.error).toMatchObject({
          type: 'request_too_large',
          code: 'request_too_large',
          limit,
          limit_value: max,
          value,
          param: field,
        });
      }
      expect((await t.call('GET', '/agents/runs')).body.data).toEqual([]);
    },
  );

  it('exactly at each limit is accepted', async () => {
    const t = await startTestServer();
    const atLimit = [
      {
        messages: Array.from({ length: 500 }, (_, i) => ({
          role: i % 2 ? 'assistant' : 'user',
          content: 'm',
        })),
      },
      {
        messages: [
          { role: 'user', content: Array.from({ length: 100 }, () => ({ type: 'text', text: 'b' })) },
        ],
      },
      { input: 'c'.repeat(1_000_000) },
    ];
    for (const body of atLimit) {
      const r = await t.call('POST', '/agents/echo/runs', { ...body, wait: false });
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(202);
    }
  });
});
