import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { defineConfig, SettingsError, resolveSettings } from '@sluice/server';
import { MemoryCacheStore } from '../../src/cache/memory.js';
import { CacheUnavailableError } from '../../src/cache/errors.js';
import { refusalOf } from '../../src/http/errors.js';
import { perProcessWarning } from '../../src/cache/open.js';
import { placeKeys } from '../../src/cache/places.js';
import { RedisCacheStore } from '../../src/cache/redis.js';
import { afterThisTest, freshDatabase, postgres, startTcpProxy, startTestServer, until } from '../helpers.js';
import { rawClient, redis, redisDatabase } from './redis.js';
import { describeWith, itWith } from '../../../../scripts/service-suites.js';

async function openStore(url: string, leaseMs = 60_000) {
  const store = await RedisCacheStore.open({ url, leaseMs });
  afterThisTest(() => store.close());
  return store;
}

/** Redis's clock in ms, the one the leases are scored in. */
async function redisNow(client: Awaited<ReturnType<typeof rawClient>>): Promise<number> {
  const [s, us] = await client.time();
  return Number(s) * 1000 + Math.floor(Number(us) / 1000);
}

/** A redis-server of this test's own, with nothing on disk: `kill` is a crash, `start` brings it back empty. */
async function throwawayRedis() {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-redis-throwaway-'));
  afterThisTest(async () => rmSync(dir, { recursive: true, force: true }));
  const port = await new Promise<number>((resolve) => {
    const probe = createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
  let exited: Promise<unknown> = Promise.resolve();
  let child: ReturnType<typeof spawn> | undefined;
  const start = () => {
    child = spawn(
      '/usr/bin/redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
      { stdio: 'ignore' },
    );
    exited = once(child, 'exit');
  };
  const kill = async () => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  };
  afterThisTest(kill);
  start();
  const url = `redis://127.0.0.1:${port}`;
  return {
    url,
    kill,
    start,
    /** A store on it, once it answers. */
    async openStore(): Promise<RedisCacheStore> {
      for (let i = 0; i < 100; i++) {
        const store = await RedisCacheStore.open({ url }).catch(() => undefined);
        if (store) {
          afterThisTest(() => store.close());
          return store;
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error('the throwaway redis-server did not start');
    },
  };
}

describeWith({ Redis: redis })('the Redis cache store against a real redis-server', () => {
  it('two stores (two server processes) share one cap: of 40 takes at once, exactly the limit succeed', async () => {
    const url = await redisDatabase(1);
    const [a, b] = [await openStore(url), await openStore(url)];
    const key = placeKeys.heldRuns('t', 'u');
    const taken = await Promise.all(Array.from({ length: 40 }, (_, i) => (i % 2 ? a : b).take(key, 7)));
    const won = taken.filter((t) => t.ok);
    expect(won).toHaveLength(7);
    for (const refused of taken.filter((t) => !t.ok)) expect(refused).toEqual({ ok: false, held: 7 });
    expect(await a.held(key)).toBe(7);
    expect(await b.held(key)).toBe(7);
    const first = won[0]!;
    if (!first.ok) throw new Error('unreachable');
    first.release();
    first.release();
    // Release is not awaited by its callers; the count drops once Redis has it.
    await a.renewNow();
    expect(await b.held(key)).toBe(6);
    // 0: no cap.
    expect((await a.take(key, 0)).ok).toBe(true);
  });

  it("a crashed process's place stops counting when its lease runs out; a live one counts; renewal never brings back a released place", async () => {
    const url = await redisDatabase(2);
    const client = await rawClient(url);
    const store = await openStore(url, 5_000);
    const key = placeKeys.wsUser('t', 'u');
    const now = await redisNow(client);
    // What a killed process leaves behind: one lease already out, one still running.
    await client.zadd(`sluice:place:${key}`, now - 1, 'dead', now + 60_000, 'alive');
    expect(await store.held(key)).toBe(1);
    const mine = await store.take(key, 2);
    expect(mine.ok).toBe(true);
    expect(await store.take(key, 2)).toEqual({ ok: false, held: 2 });
    expect(await client.zscore(`sluice:place:${key}`, 'dead')).toBeNull();
    // The set expires with its newest lease: an abandoned key does not stay forever.
    const ttl = await client.pttl(`sluice:place:${key}`);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(5_000);

    const members = await client.zrange(`sluice:place:${key}`, 0, -1, 'WITHSCORES');
    const myMember = members.filter((_, i) => i % 2 === 0).find((m) => m !== 'alive')!;
    const before = Number(await client.zscore(`sluice:place:${key}`, myMember));
    const start = await redisNow(client);
    while ((await redisNow(client)) < start + 5) await client.ping();
    await store.renewNow();
    const after = Number(await client.zscore(`sluice:place:${key}`, myMember));
    expect(after).toBeGreaterThan(before);
    if (!mine.ok) throw new Error('unreachable');
    // renewNow resolves only once the release has reached Redis, even with a renewal (the
    // timer's) already under way: this read goes over another connection, and loopback does
    // not order two connections' writes (a CI run once read the place back before its removal).
    const timerRenewal = store.renewNow();
    mine.release();
    await store.renewNow();
    expect(await client.zscore(`sluice:place:${key}`, myMember)).toBeNull();
    expect(await store.held(key)).toBe(1);
    await timerRenewal;
  });

  it('two renewals at once just after the last place is released both resolve (no endless spin that starves the event loop)', async () => {
    // In a child: a renewal that spins on microtasks never lets this process run again, so the
    // test's own timeout could not fire. The timer does the same in production when Redis is slow
    // to answer a release for longer than one renewal period (a stall, a FAILOVER pause): the
    // process then stays at 100% CPU and answers nothing, even after Redis is back.
    const url = await redisDatabase(7);
    const script = `
      import { RedisCacheStore } from './packages/server/src/cache/redis.ts';
      const store = await RedisCacheStore.open({ url: ${JSON.stringify(url)} });
      const place = await store.take('k', 0);
      place.release();
      await Promise.all([store.renewNow(), store.renewNow()]);
      console.log('renewed');
      await store.close();`;
    const child = spawn(
      process.execPath,
      ['--conditions=@sluice/source', '--import', 'tsx', '--input-type=module', '-e', script],
      { cwd: fileURLToPath(new URL('../../../../', import.meta.url)), stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const exited = once(child, 'exit');
    afterThisTest(async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    expect(await exited).toEqual([0, null]);
    expect(out).toBe('renewed\n');
    const client = await rawClient(url);
    expect(await client.zcard('sluice:place:k')).toBe(0);
  }, 20_000);

  it('closing a store gives back the places its process held', async () => {
    const url = await redisDatabase(3);
    const other = await openStore(url);
    const store = await RedisCacheStore.open({ url });
    const key = placeKeys.heldRuns('t', 'v');
    for (let i = 0; i < 3; i++) expect((await store.take(key, 5)).ok).toBe(true);
    expect(await other.held(key)).toBe(3);
    await store.close();
    expect(await other.held(key)).toBe(0);
  });

  it('failed-auth counts in a shared window, and revocations seen by every process', async () => {
    const url = await redisDatabase(4);
    const [a, b] = [await openStore(url), await openStore(url)];
    for (let i = 1; i <= 3; i++)
      expect((await (i % 2 ? a : b).hit('authfail:198.51.100.7', 60_000)).count).toBe(i);
    const seen = await b.count('authfail:198.51.100.7');
    expect(seen.count).toBe(3);
    expect(seen.leftMs).toBeGreaterThan(0);
    expect(seen.leftMs).toBeLessThanOrEqual(60_000);
    expect(await a.count('authfail:198.51.100.8')).toEqual({ count: 0, leftMs: 0 });
    expect(await b.isRevoked('tok_1')).toBe(false);
    await a.revoke('tok_1');
    expect(await b.isRevoked('tok_1')).toBe(true);
    // A revocation has no expiry.
    const client = await rawClient(url);
    expect(await client.pttl('sluice:revoked:tok_1')).toBe(-1);
  });

  it('a Redis that goes away: requests that need it get 503 cache_unavailable with Retry-After, not a 500 and not an unchecked admission', async () => {
    const server = await throwawayRedis();
    const store = await server.openStore();
    expect((await store.take('k', 1)).ok).toBe(true);
    await server.kill();
    for (const attempt of [() => store.take('k', 1), () => store.count('a'), () => store.hit('a', 1000)]) {
      const error = await attempt().then(
        () => undefined,
        (e: unknown) => e,
      );
      // The store throws its own error; the HTTP layer answers it as 503 with Retry-After.
      expect(error, String(attempt)).toBeInstanceOf(CacheUnavailableError);
      const answer = refusalOf(error)!;
      expect(answer.status).toBe(503);
      expect(answer.body().error.type).toBe('cache_unavailable');
      expect(answer.headers['retry-after']).toBe('5');
    }
  });

  it('a Redis restarted empty gets back the places the live processes hold: a user at the cap stays at it', async () => {
    const server = await throwawayRedis();
    const holder = await server.openStore();
    const key = placeKeys.heldRuns('t', 'u');
    const first = await holder.take(key, 2);
    const second = await holder.take(key, 2);
    expect([first.ok, second.ok]).toEqual([true, true]);

    await server.kill();
    server.start();
    // A process that connects after the restart sees the user's two places again once the
    // holder has reconnected to the new server: a third is refused.
    const other = await server.openStore();
    await until(
      async () => (await holder.held(key).catch(() => 0)) === 2,
      'the places back after the restart',
    );
    await holder.reclaimed();
    expect(await other.take(key, 2)).toEqual({ ok: false, held: 2 });
    // Given back, a place is free again for the other process.
    if (first.ok) first.release();
    await holder.renewNow();
    expect((await other.take(key, 2)).ok).toBe(true);
  });

  it('a connection to Redis that goes silent (no reset): a request gets 503 after the command timeout, and the store opens a new connection', async () => {
    const direct = new URL(await redisDatabase(8));
    const proxy = await startTcpProxy({ host: direct.hostname, port: Number(direct.port) });
    const url = `redis://127.0.0.1:${proxy.port}/8`;
    const store = await RedisCacheStore.open({ url, commandTimeoutMs: 300 });
    afterThisTest(() => store.close());
    const key = placeKeys.heldRuns('t', 'silent');
    expect((await store.take(key, 5)).ok).toBe(true);

    proxy.stall();
    const stalled = await store.take(key, 5).then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(stalled).toBeInstanceOf(CacheUnavailableError);
    expect(refusalOf(stalled)).toMatchObject({ status: 503, type: 'cache_unavailable' });
    // The silent connection is dropped; the next one goes through, and the count is Redis's.
    await until(async () => (await store.held(key).catch(() => -1)) === 1, 'answers on a new connection');
    expect((await store.take(key, 5)).ok).toBe(true);
    expect(await store.held(key)).toBe(2);
  });

  it('a Redis that does not answer fails the start, naming REDIS_URL and hiding the password', async () => {
    await expect(RedisCacheStore.open({ url: 'redis://:hunter2@127.0.0.1:9/0' })).rejects.toThrow(
      /The Redis cache store at redis:\/\/:\*\*\*@127\.0\.0\.1:9\/0 \(REDIS_URL\) does not answer/,
    );
  });
});

describe('cache store settings', () => {
  it('SLUICE_CACHE_STORE and REDIS_URL override the config; a bad value names the variable', () => {
    expect(resolveSettings({}, {})).toMatchObject({
      cacheStore: 'memory',
      redisUrl: null,
      trustProxyHops: 0,
    });
    expect(
      resolveSettings({ cacheStore: 'memory' }, { SLUICE_CACHE_STORE: 'redis', REDIS_URL: 'redis://r:6379' }),
    ).toMatchObject({ cacheStore: 'redis', redisUrl: 'redis://r:6379' });
    expect(() => resolveSettings({}, { SLUICE_CACHE_STORE: 'memcached' })).toThrow(
      /SLUICE_CACHE_STORE \(cacheStore\) to be memory or redis, got `memcached`/,
    );
    expect(() => resolveSettings({}, { SLUICE_CACHE_STORE: 'redis' })).toThrow(SettingsError);
    expect(() => resolveSettings({}, { SLUICE_CACHE_STORE: 'redis' })).toThrow(
      /REDIS_URL \(redisUrl\) must name/,
    );
    expect(() => resolveSettings({}, { REDIS_URL: 'http://secret@x' })).toThrow(/not shown/);
    expect(() => resolveSettings({}, { SLUICE_TRUST_PROXY_HOPS: '11' })).toThrow(
      /SLUICE_TRUST_PROXY_HOPS .* from 0 to 10, got `11`/,
    );
  });
});

/** A server's warn lines while it starts, then closed. */
async function startWarnings(options: {
  databaseUrl: string;
  cacheStore: 'memory' | 'redis';
  redisUrl?: string;
}) {
  const lines: string[] = [];
  const { server } = await startTestServer({
    databaseUrl: options.databaseUrl,
    config: defineConfig({
      agents: {
        echo: createAgent({
          model: {
            api: 'openai-completions',
            provider: 'stand-in',
            id: 'm',
            baseUrl: 'http://127.0.0.1:9/v1',
          },
          credentials: { apiKey: 'k' },
        }),
      },
      cacheStore: options.cacheStore,
      redisUrl: options.redisUrl,
    }),
    logger: { level: 'warn', stream: { write: (line: string) => void lines.push(line) } },
  });
  await server.close();
  return lines.map((line) => JSON.parse(line) as { level: number; msg: string });
}

describe('the warning at start', () => {
  itWith({ PostgreSQL: postgres, Redis: redis })(
    'a server on PostgreSQL says its counts are per process with the memory store, and nothing of the kind with Redis',
    async () => {
      const databaseUrl = await freshDatabase();
      const memory = await startWarnings({ databaseUrl, cacheStore: 'memory' });
      const warning = memory.filter((l) => l.msg.includes('per process'));
      expect(warning).toHaveLength(1);
      expect(warning[0]!.level).toBe(40);
      expect(warning[0]!.msg).toMatch(
        /per-user cap.*WebSocket connection caps.*failed-authentication limiter/,
      );
      const shared = await startWarnings({
        databaseUrl,
        cacheStore: 'redis',
        redisUrl: await redisDatabase(5),
      });
      expect(shared.filter((l) => /per process|cache store/.test(l.msg))).toEqual([]);
    },
  );

  it("embedded PGlite is one process's database anyway: no warning there", () => {
    expect(perProcessWarning(new MemoryCacheStore(), false)).toBeUndefined();
    expect(perProcessWarning(new MemoryCacheStore(), true)).toContain('per process');
  });
});
