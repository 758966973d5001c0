import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect, it } from 'vitest';
import { tenantSigningSecret, verifyWebhook } from '../../src/callbacks/index.js';
import { afterThisTest, startTestServer, until } from '../helpers.js';

/** A receiver on loopback that keeps every delivery it gets. */
async function startReceiver() {
  const received: { headers: IncomingHttpHeaders; body: string }[] = [];
  const receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      received.push({ headers: req.headers, body });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  afterThisTest(() => new Promise((r) => receiver.close(() => r())));
  return { url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`, received };
}

it('M4/M5: one signed delivery for every final state (succeeded, failed, canceled, expired), verified with the tenant secret', async () => {
  const { call, server } = await startTestServer({
    settings: {
      callbackAllowPrivate: true,
      deferredMaxRunningPerTenant: 1,
      deferredMaxWaitMs: 300,
      nodeStaleMs: 400,
    },
  });
  const hook = await startReceiver();
  const ids = {} as Record<'succeeded' | 'failed' | 'expired' | 'canceled', string>;
  ids.succeeded = (
    await call('POST', '/agents/echo/runs', { input: 'hello', callback_url: hook.url })
  ).body.id;
  ids.failed = (
    await call('POST', '/agents/echo/runs', { input: 'fail please', callback_url: hook.url })
  ).body.id;
  // A deferred run holds the tenant's one deferred slot, so the next one waits and expires.
  const holder = (await call('POST', '/agents/echo/runs', { input: 'stall', class: 'deferred' })).body.id;
  ids.expired = (
    await call('POST', '/agents/echo/runs', { input: 'late', class: 'deferred', callback_url: hook.url })
  ).body.id;
  ids.canceled = (
    await call('POST', '/agents/echo/runs', { input: 'x', delay_seconds: 3600, callback_url: hook.url })
  ).body.id;
  expect((await call('POST', `/agents/runs/${ids.canceled}/cancel`)).body.status).toBe('canceled');
  await until(() => hook.received.length >= 4, 'four deliveries');
  await call('POST', `/agents/runs/${holder}/cancel`);

  const secret = await tenantSigningSecret(server.store.db, 't');
  const byRun = new Map<string, { status: string; error: { type: string } | null }>();
  for (const delivery of hook.received) {
    const verified = verifyWebhook(secret, delivery.headers, delivery.body);
    expect(verified.ok).toBe(true);
    const run = JSON.parse(delivery.body) as { id: string; status: string; error: { type: string } | null };
    expect(byRun.has(run.id)).toBe(false); // exactly one delivery per run
    byRun.set(run.id, run);
  }
  expect(byRun.get(ids.succeeded)?.status).toBe('succeeded');
  expect(byRun.get(ids.failed)).toMatchObject({ status: 'failed', error: { type: 'agent_error' } });
  expect(byRun.get(ids.expired)).toMatchObject({ status: 'failed', error: { type: 'expired' } });
  expect(byRun.get(ids.canceled)?.status).toBe('canceled');
  // A tampered body fails verification.
  const first = hook.received[0]!;
  expect(verifyWebhook(secret, first.headers, first.body.replace('"status"', '"Status"')).ok).toBe(false);
}, 60_000);

it('H1: loopback, private, metadata and credential callback URLs are refused at creation with 400', async () => {
  const { call } = await startTestServer();
  for (const url of [
    'http://127.0.0.1:9999/',
    'http://localhost/',
    'http://[::1]/',
    'http://10.0.0.1/',
    'http://169.254.169.254/latest/meta-data/',
    'http://2130706433/',
    'http://0x7f.1/',
    'http://[::ffff:127.0.0.1]/',
    'http://user:pass@example.com/',
    'ftp://example.com/',
  ]) {
    const refused = await call('POST', '/agents/echo/runs', { input: 'x', callback_url: url });
    expect([url, refused.status]).toEqual([url, 400]);
    expect(refused.body.error).toMatchObject({ type: 'invalid_request', param: 'callback_url' });
  }
  const listed = await call('GET', '/agents/runs');
  expect(listed.body.data).toHaveLength(0); // nothing was admitted
});
