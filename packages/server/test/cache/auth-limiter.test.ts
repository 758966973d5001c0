import type { FastifyInstance } from 'fastify';
import { beforeAll, describe, expect, it } from 'vitest';
import { createApp, createToken, resolveSettings, type RunningServer } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { MemoryCacheStore } from '../../src/cache/memory.js';
import { failedAuthKey, failedAuthLimit } from '../../src/http/auth.js';
import { standardHeaders } from '../triggers/harness.js';
import { type Body, lastUserText, ownServer, ownStandIn, startTestServer, until } from '../helpers.js';

/**
 * One server for the file (the CI budget): on embedded PGlite with the memory store, a per-user
 * cap of 1, and a second app on the same store that trusts one proxy hop.
 */
let provider: ProviderStandIn;
let server: RunningServer;
let behindProxy: FastifyInstance;
let admin: string;

beforeAll(async () => {
  provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => (lastUserText(r).includes('stall') ? { stall: true } : { text: 'done' }),
    }),
  );
  const t = await startTestServer({ provider, runs: { maxConcurrentPerUser: 1 } });
  server = t.server;
  admin = t.admin;
  // A second app on the same store, trusting one proxy hop; closed (and checked) after the file.
  const proxied = await createApp({
    store: server.store,
    config: server.config,
    settings: resolveSettings({ trustProxyHops: 1 }, {}),
    logger: false,
  });
  ownServer(proxied, {});
  behindProxy = proxied.fastify;
});

/** A request through the app's routing as if it came from `address` (the socket's peer). */
async function from(
  app: FastifyInstance,
  address: string,
  options: { token?: string; forwardedFor?: string; path?: string; body?: unknown } = {},
) {
  const reply = await app.inject({
    method: options.body === undefined ? 'GET' : 'POST',
    url: `/api/client/v1${options.path ?? '/threads/thr_none'}`,
    remoteAddress: address,
    headers: {
      ...(options.token !== undefined && { authorization: `Bearer ${options.token}` }),
      ...(options.forwardedFor !== undefined && { 'x-forwarded-for': options.forwardedFor }),
    },
    ...(options.body !== undefined && { payload: options.body as object }),
  });
  return { status: reply.statusCode, headers: reply.headers, body: reply.json<Body>() };
}

describe('the failed-authentication limiter', () => {
  it('failures past 20 a minute from one address get 429 instead of 401, a good token still gets in, other addresses are untouched; X-Forwarded-For is not trusted by default', async () => {
    const t = server.fastify;
    const bad = 'sk_wrong';
    for (let i = 1; i <= failedAuthLimit.failures; i++) {
      const reply = await from(t, '192.0.2.1', i % 2 ? { token: bad } : {});
      expect(reply.status, `failure ${i}`).toBe(401);
    }
    const refused = await from(t, '192.0.2.1', { token: bad });
    expect(refused.status).toBe(429);
    expect(refused.body).toEqual({
      error: {
        type: 'too_many_failed_authentications',
        code: 'too_many_failed_authentications',
        message: expect.stringMatching(/More than 20 failed authentications in a minute/),
        param: null,
        limit: 20,
        window_seconds: 60,
      },
    });
    const retryAfter = Number(refused.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(60);
    expect((await from(t, '192.0.2.1', {})).status).toBe(429);
    // A good token still gets in, from that address too (404: authenticated, no such thread):
    // another client behind the same NAT is not locked out. Other addresses are untouched.
    expect((await from(t, '192.0.2.1', { token: admin })).status).toBe(404);
    expect((await from(t, '192.0.2.2', { token: bad })).status).toBe(401);

    // Without a trusted proxy the header is the client's own words: every failure counts
    // against the socket's address, whatever address the header claims.
    for (let i = 0; i < failedAuthLimit.failures; i++) {
      expect((await from(t, '192.0.2.3', { token: bad, forwardedFor: `198.51.100.${i}` })).status).toBe(401);
    }
    expect((await from(t, '192.0.2.3', { token: bad, forwardedFor: '198.51.100.200' })).status).toBe(429);
  });

  it('behind one trusted proxy (SLUICE_TRUST_PROXY_HOPS=1) the address the proxy appended counts; a forged entry before it does not help', async () => {
    const t = behindProxy;
    const proxy = '10.0.0.5';
    for (let i = 0; i < failedAuthLimit.failures; i++) {
      // A client that writes its own X-Forwarded-For gets the proxy's entry appended after it.
      const forged = `203.0.113.${100 + i}, 203.0.113.9`;
      expect((await from(t, proxy, { token: 'sk_wrong', forwardedFor: forged })).status).toBe(401);
    }
    expect((await from(t, proxy, { token: 'sk_wrong', forwardedFor: '203.0.113.9' })).status).toBe(429);
    expect((await from(t, proxy, { token: admin, forwardedFor: '203.0.113.10' })).status).toBe(404);
    expect((await from(t, proxy, { token: 'sk_wrong', forwardedFor: '203.0.113.10' })).status).toBe(401);
  });

  it('a flood of distinct failing addresses (500 through HTTP, 100,000 more on the store) evicts neither a held place nor a revocation', async () => {
    const t = server.fastify;
    const cache = server.cache;
    if (!(cache instanceof MemoryCacheStore)) throw new Error('expected the memory cache store');
    const member = (
      await createToken(server.store.db, { tenant: 't', project: 'p', user: 'flooded', role: 'member' })
    ).secret;
    const held = from(t, '192.0.2.50', {
      token: member,
      path: '/agents/echo/runs',
      body: { input: 'stall' },
    });
    // Answered (503) only when the server closes after the test.
    held.catch(() => undefined);
    await until(() => provider.requests.length === 1, 'the held run reaching the model');
    await cache.revoke('tok_revoked_before_the_flood');

    for (let i = 0; i < 500; i++) {
      expect((await from(t, `172.16.${i >> 8}.${i & 255}`, { token: 'sk_wrong' })).status).toBe(401);
    }
    for (let i = 0; i < 100_000; i++) {
      await cache.hit(failedAuthKey(`10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`), 60_000);
    }
    expect(cache.map.size).toBe(cache.map.maxKeys);
    // The early HTTP failures were the least recently used: evicted.
    expect((await cache.count(failedAuthKey('172.16.0.0'))).count).toBe(0);

    // The user's one place is still held: a second held run is over the per-user cap.
    const over = await from(t, '192.0.2.51', {
      token: member,
      path: '/agents/echo/runs',
      body: { input: 'again' },
    });
    expect(over.status).toBe(429);
    expect(over.body.error).toMatchObject({ type: 'agent_run_concurrency_limit', scope: 'user' });
    expect(await cache.isRevoked('tok_revoked_before_the_flood')).toBe(true);
  });

  it("a webhook's refusals (made-up trigger ids, bad signatures) count with token failures from the address; a signed delivery still gets in", async () => {
    const t = server.fastify;
    const created = await t.inject({
      method: 'POST',
      url: '/api/client/v1/triggers',
      headers: { authorization: `Bearer ${admin}` },
      payload: { name: 'limited', agent: 'echo', class: 'deferred' },
    });
    expect(created.statusCode, created.body).toBe(201);
    const trigger = created.json<{ id: string; secret: string }>();
    const hook = (id: string, headers: Record<string, string>, address = '192.0.2.40') =>
      t.inject({
        method: 'POST',
        url: `/api/client/v1/triggers/${id}/webhook`,
        remoteAddress: address,
        headers: { 'content-type': 'application/json', ...headers },
        payload: '{"n":1}',
      });
    const half = failedAuthLimit.failures / 2;
    for (let i = 0; i < half; i++) {
      const made = await hook(
        `trg_${'0'.repeat(23)}${i}`,
        standardHeaders(trigger.secret, `m${i}`, '{"n":1}'),
      );
      expect(made.statusCode, `made-up id ${i}`).toBe(401);
      expect((await from(t, '192.0.2.40', { token: 'sk_wrong' })).status).toBe(401);
    }
    const wrong = await hook(trigger.id, {
      ...standardHeaders(trigger.secret, 'm_bad', '{"n":1}'),
      'webhook-signature': 'v1,AAAA',
    });
    expect(wrong.statusCode).toBe(429);
    expect(wrong.json<Body>().error.type).toBe('too_many_failed_authentications');
    expect(Number(wrong.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect((await from(t, '192.0.2.40', { token: 'sk_wrong' })).status).toBe(429);
    // A good signature is the credential: it is let in from that address all the same.
    const good = await hook(trigger.id, standardHeaders(trigger.secret, 'm_good', '{"n":1}'));
    expect(good.statusCode, good.body).toBe(202);
    // Another address's bad signature is still an ordinary 401.
    const elsewhere = await hook(trigger.id, { 'webhook-signature': 'v1,AAAA' }, '192.0.2.41');
    expect(elsewhere.statusCode).toBe(401);
    expect(elsewhere.json<Body>().error.type).toBe('webhook_signature_invalid');
  });
});
