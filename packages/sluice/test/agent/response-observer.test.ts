import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { observeResponses } from '../../src/models/response-observer.js';

// Inside an observed provider request, a response the SDK would consider retrying (not a 2xx)
// comes back marked `x-should-retry: false`, so that our retry policy decides; a 2xx is handed
// over exactly as the provider sent it (no copy of its headers on every model call).

let server: Server;
let url: string;
beforeAll(async () => {
  server = createServer((request, response) => {
    const status = Number(request.url!.slice(1));
    response.writeHead(status, { 'content-type': 'application/json', 'x-ratelimit-remaining-requests': '7' });
    response.end(JSON.stringify({ status }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.close();
  await once(server, 'close');
});

async function observed(status: number) {
  const seen: [number, string | null][] = [];
  const response = await observeResponses(
    (s, headers) => seen.push([s, headers.get('x-ratelimit-remaining-requests')]),
    () => fetch(`${url}/${status}`),
  );
  return { response, seen, body: (await response.json()) as { status: number } };
}

it.each([200, 201])('a %i is seen by the observer and handed over unmarked', async (status) => {
  const { response, seen, body } = await observed(status);
  expect(seen).toEqual([[status, '7']]);
  expect([response.status, response.headers.get('x-should-retry'), body.status]).toEqual([
    status,
    null,
    status,
  ]);
});

it.each([400, 429, 500, 503])(
  'a %i is seen by the observer and marked x-should-retry: false',
  async (status) => {
    const { response, seen, body } = await observed(status);
    expect(seen).toEqual([[status, '7']]);
    expect([response.status, response.headers.get('x-should-retry'), body.status]).toEqual([
      status,
      'false',
      status,
    ]);
    expect(response.headers.get('x-ratelimit-remaining-requests')).toBe('7');
  },
);

it('a response outside an observed context is not marked', async () => {
  const response = await fetch(`${url}/503`);
  expect(response.headers.get('x-should-retry')).toBeNull();
  await response.arrayBuffer();
});
