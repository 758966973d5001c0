import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, postgres, until } from '../helpers.js';
import { send, sluice, startServer, testDatabase, type ServerProc } from '../process/harness.js';
import { rawClient, redis, redisDatabase } from './redis.js';
import { describeWith } from '../../../../scripts/service-suites.js';

// Long enough that a peer on a busy machine does not declare a live process lost mid-test.
const NODE_STALE_MS = 5000;
/** A thread's lock and a Redis place both live 3 x nodeStaleMs past their last renewal. */
const LEASE_MS = 3 * NODE_STALE_MS;

describeWith({ PostgreSQL: postgres, Redis: redis })(
  'two server processes on one PostgreSQL and one Redis',
  () => {
    it('share the per-user cap, the thread lock, revocations and the failed-auth limiter; kill -9 of one frees its thread and places within the lease', async () => {
      const database = await testDatabase();
      const redisUrl = await redisDatabase(6);
      const redis = await rawClient(redisUrl);
      const provider = await startProviderStandIn({
        reply: (r) => (lastUserText(r).startsWith('stall') ? { stall: true } : { text: 'done' }),
      });
      afterThisTest(() => provider.close());
      const env = {
        DATABASE_URL: database.url,
        PROVIDER_URL: provider.url,
        SLUICE_CACHE_STORE: 'redis',
        REDIS_URL: redisUrl,
        SLUICE_MAX_CONCURRENT_PER_USER: '2',
        SLUICE_NODE_STALE_MS: String(NODE_STALE_MS),
        SLUICE_THREAD_BUSY_WAIT_MS: '300',
        SLUICE_TRUST_PROXY_HOPS: '1',
      };
      const [a, b] = await Promise.all([startServer(env), startServer(env)]);
      const capped = (await database.token({ user: 'capped', role: 'member' })).secret;
      const threads = (await database.token({ user: 'threads', role: 'member' })).secret;
      const run = (server: ServerProc, token: string, body: object) =>
        send(server.url, 'POST', '/api/client/v1/agents/echo/runs', { token, body });

      // The per-user cap of 2: one held run on each process, then a third on either is refused.
      void run(a, capped, { input: 'stall on A' });
      void run(b, capped, { input: 'stall on B' });
      await until(() => provider.requests.length === 2, 'both held runs at the model');
      for (const server of [a, b]) {
        const over = await run(server, capped, { input: 'third' });
        expect(over.status).toBe(429);
        expect(over.body.error).toMatchObject({ type: 'agent_run_concurrency_limit', scope: 'user' });
        expect(Number(over.headers.get('retry-after'))).toBeGreaterThan(0);
      }

      // A thread held by a run in A is busy for B.
      const thread = await send(a.url, 'POST', '/api/client/v1/threads', { token: threads, body: {} });
      expect(thread.status).toBe(201);
      const threadId = thread.body.id as string;
      void run(a, threads, { input: 'stall on the thread', thread_id: threadId });
      await until(() => provider.requests.length === 3, 'the thread run at the model');
      const busy = await run(b, threads, { input: 'next', thread_id: threadId });
      expect(busy.status).toBe(409);
      expect(busy.body.error).toMatchObject({ type: 'thread_busy', thread_id: threadId });
      expect(busy.body.error.active_run_id).toMatch(/^run_/);

      // A revocation: refused by both processes on their very next request.
      const leaver = await database.token({ user: 'leaver', role: 'member' });
      const list = (server: ServerProc) =>
        send(server.url, 'GET', '/api/client/v1/agents/runs', { token: leaver.secret });
      expect([(await list(a)).status, (await list(b)).status]).toEqual([200, 200]);
      const revoke = sluice(['tokens', 'revoke', leaver.id], { env });
      expect(await revoke.closed).toEqual({ code: 0, signal: null });
      expect([(await list(a)).status, (await list(b)).status]).toEqual([401, 401]);
      expect(await redis.exists(`sluice:revoked:${leaver.id}`)).toBe(1);

      // Failed authentications from one address count on both processes together.
      const failFrom = (server: ServerProc, address: string) =>
        fetch(`${server.url}/api/client/v1/agents/runs`, {
          headers: { authorization: 'Bearer sk_wrong', 'x-forwarded-for': address },
        }).then(async (r) => (await r.arrayBuffer(), r.status));
      for (let i = 0; i < 20; i++) expect(await failFrom(i % 2 ? a : b, '203.0.113.7')).toBe(401);
      expect([await failFrom(a, '203.0.113.7'), await failFrom(b, '203.0.113.7')]).toEqual([429, 429]);
      expect(await failFrom(b, '203.0.113.8')).toBe(401);

      // kill -9 of A: nothing is released, so the thread and A's places free by their leases.
      a.child.kill('SIGKILL');
      expect(await a.closed).toEqual({ code: null, signal: 'SIGKILL' });
      const [lock] = await database.rows<{ left_ms: number }>(
        `SELECT (extract(epoch FROM lock_expires_at - clock_timestamp()) * 1000)::float8 AS left_ms, * FROM threads WHERE id = $1`,
        [threadId],
      );
      expect(lock, JSON.stringify(lock)).toMatchObject({ left_ms: expect.any(Number) });
      expect(lock!.left_ms).toBeLessThanOrEqual(LEASE_MS);
      const [seconds, micros] = await redis.time();
      const redisNow = Number(seconds) * 1000 + Number(micros) / 1000;
      const placeKeys = await redis.keys('sluice:place:*');
      expect(placeKeys.length).toBeGreaterThan(0);
      for (const key of placeKeys) {
        const scores = await redis.zrange(key, 0, -1, 'WITHSCORES');
        for (let i = 1; i < scores.length; i += 2)
          expect(Number(scores[i]) - redisNow).toBeLessThanOrEqual(LEASE_MS);
      }

      // B gets the thread once the lease ran out (or A's run was declared lost), and the user's
      // place A held comes back: one more held run fits beside the one still held on B.
      let after: Awaited<ReturnType<typeof run>> | undefined;
      await until(async () => {
        after = await run(b, threads, { input: 'after the crash', thread_id: threadId });
        return after.status !== 409;
      }, 'the thread freed after kill -9');
      expect(after!.status).toBe(200);
      expect(after!.body.status).toBe('succeeded');
      let again: Awaited<ReturnType<typeof run>> | undefined;
      await until(async () => {
        again = await run(b, capped, { input: 'fits again' });
        return again.status !== 429;
      }, "the capped user's place on A freed after kill -9");
      expect(again!.status).toBe(200);
    }, 180_000);
  },
);
