import { once } from 'node:events';
import net from 'node:net';
import { expect, it } from 'vitest';
import { startTestServer } from '../helpers.js';
import { startCountedApp } from './harness.js';

/**
 * Opens a socket, sends a request's headers announcing a 1,000-byte body, then one byte of it
 * and nothing more; resolves with what came back and how long the server kept the socket.
 */
function trickle(url: string, token?: string): Promise<{ received: string; heldMs: number }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const started = Date.now();
    let received = '';
    const socket = net.connect({ host: hostname, port: Number(port) }, () => {
      socket.write(
        [
          'POST /api/client/v1/agents/echo/runs HTTP/1.1',
          `Host: ${hostname}:${port}`,
          'Content-Type: application/json',
          'Content-Length: 1000',
          ...(token ? [`Authorization: Bearer ${token}`] : []),
          '',
          '{',
        ].join('\r\n'),
      );
    });
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (received += chunk));
    socket.on('error', reject);
    socket.on('close', () => resolve({ received, heldMs: Date.now() - started }));
  });
}

it('M13: a connection that sends headers and one byte of its body is closed after SLUICE_REQUEST_TIMEOUT_MS', async () => {
  const { server, token } = await startTestServer({ settings: { requestTimeoutMs: 1000 } });
  const member = await token({ role: 'member' });
  // With a token the server waits for the body; without one it answers 401 first, and the body
  // it never read must not keep the socket either.
  const [authorized, anonymous] = await Promise.all([trickle(server.url, member), trickle(server.url)]);
  expect(authorized.received).toMatch(/^HTTP\/1\.1 408 /);
  // Not cut for some other reason before its time; and well before Node's own checks (30 s) would.
  expect(authorized.heldMs).toBeGreaterThanOrEqual(1000);
  expect(authorized.heldMs).toBeLessThan(10_000);
  expect(anonymous.received).toMatch(/^HTTP\/1\.1 401 /);
  expect(anonymous.heldMs).toBeLessThan(10_000);
  // The server still answers.
  expect((await fetch(`${server.url}/readyz`)).status).toBe(200);
}, 60_000);

it('M13: a connection that never sends a request does not hold a drain (Node stops timing connections out once it closes)', async () => {
  const { app, url } = await startCountedApp({});
  const { hostname, port } = new URL(url);
  const silent = net.connect({ host: hostname, port: Number(port) });
  await once(silent, 'connect');
  const cut = once(silent, 'close');
  await app.drain();
  await cut;
}, 60_000);
