import { connect } from 'node:net';
import { expect, it } from 'vitest';
import { upstreamPath } from '../../src/gateway/path.js';
import { startGatewayServer } from './harness.js';

// The path is joined to the upstream as text and may not climb out of it: hostile spellings
// are refused before anything is sent, whatever a client's URL parser would have made of them.

const prefix = '/api/client/v1/gateway/openai';

it('joins the rest of the path and the query to the base path as text', () => {
  expect(upstreamPath(`${prefix}/chat/completions`, '/v1')).toBe('/v1/chat/completions');
  expect(upstreamPath(`${prefix}/models?limit=2&after=a%2Fb`, '/v1')).toBe('/v1/models?limit=2&after=a%2Fb');
  expect(upstreamPath(`${prefix}/v1/messages`, '')).toBe('/v1/messages');
  expect(upstreamPath(`${prefix}/`, '/v1')).toBe('/v1/');
  // A query may hold what a path may not: it is the upstream's to read.
  expect(upstreamPath(`${prefix}/models?next=../x//y`, '/v1')).toBe('/v1/models?next=../x//y');
});

const hostile = [
  `${prefix}/../../admin`,
  `${prefix}/..`,
  `${prefix}/./models`,
  `${prefix}/%2e%2e/admin`,
  `${prefix}/%2E./admin`,
  `${prefix}/.%2e`,
  `${prefix}//evil.com/x`,
  `${prefix}/models//x`,
  `${prefix}/a%2f..%2fb`,
  `${prefix}/a%5c..%5cb`,
  `${prefix}/a\\b`,
  `${prefix}/a b`,
  `${prefix}/a\u0000b`,
  `${prefix}?only=query`,
];

it.each(hostile)('refuses %j', (url) => {
  expect(() => upstreamPath(url, '/v1')).toThrow(/The path/);
});

/** One request over a raw socket, the target sent exactly as given; the status line back. */
function rawStatus(url: string, target: string, token: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      socket.write(
        `GET ${target} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\nconnection: close\r\n\r\n`,
      );
    });
    let text = '';
    socket.on('data', (c: Buffer) => (text += c.toString('latin1')));
    socket.on('end', () => resolve(text.split('\r\n')[0]!));
    socket.on('error', reject);
  });
}

it('over a socket, hostile paths get 400 in the API shape and nothing reaches the provider; a `__proto__` gateway is 404', async () => {
  const s = await startGatewayServer();
  const token = await s.token({ tenant: 'acme' });
  for (const target of [
    `${prefix}/../../../metrics`,
    `${prefix}/%2e%2e/%2e%2e/metrics`,
    `${prefix}//evil.com/v1/models`,
    `${prefix}/models/..%2F..%2Fsecret`,
  ])
    expect(await rawStatus(s.server.url, target, token), target).toBe('HTTP/1.1 400 Bad Request');
  expect(await rawStatus(s.server.url, '/api/client/v1/gateway/__proto__/models', token)).toBe(
    'HTTP/1.1 404 Not Found',
  );
  expect(await rawStatus(s.server.url, '/api/client/v1/gateway/hasOwnProperty/models', token)).toBe(
    'HTTP/1.1 404 Not Found',
  );
  expect(await rawStatus(s.server.url, `${prefix}/models`, token)).toBe('HTTP/1.1 200 OK');
  expect(s.provider.requests.map((r) => r.path)).toEqual(['/v1/models']);
}, 240_000);
