import { rmSync } from 'node:fs';
import { createServer } from 'node:net';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { systemClock } from 'sluice/concurrency';
import { defineConfig, serve } from '@sluice/server';
import { assertNoLeaks, findTestLeaks, LeakError } from './leak-guard.js';
import { poolLeftovers, postgres, preparedDataDir } from './database.js';
import { afterThisTest, watchForLeaks } from './registry.js';
import { serverLeftovers, startTestServer } from './server.js';
import { standInModel, startStandIn } from './stand-in.js';
import { pendingSluiceTimers } from './timers.js';
import { until } from './wait.js';
import { itWith } from '../../../../scripts/service-suites.js';

// The guard's own tests: each leaves one kind of thing behind on purpose, runs the guard's check
// (`findTestLeaks`, what the setup file's afterEach runs) directly, and expects it named; then
// it puts things right, so the real afterEach after it finds nothing.

describe('the leak guard', () => {
  it('names a server that is still executing a run, and the run', async () => {
    const { server, call } = await startTestServer();
    const started = await call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
    await until(() => server.executor.active === 1, 'the run executing');
    const left = await serverLeftovers(server);
    expect(left).toEqual(['still listening', `runs still executing: ${started.body.id}`]);
    await server.close();
    expect(await serverLeftovers(server)).toEqual([]);
  });

  itWith({ PostgreSQL: postgres })(
    'names a run its server left running in the PostgreSQL database',
    async () => {
      const { server, call, databaseUrl } = await startTestServer({ database: 'postgres' });
      const started = await call('POST', '/agents/echo/runs', { input: 'stall', wait: false });
      await until(() => server.executor.active === 1, 'the run executing');
      expect(await serverLeftovers(server, databaseUrl)).toContain(
        `runs left running in the database: ${started.body.id}`,
      );
      // Closing ends the run (interrupted): nothing of this server is left running then.
      await server.close();
      expect(await serverLeftovers(server, databaseUrl)).toEqual([]);
    },
  );

  it('fails a test that started a server by hand and never closed it: its timers are pending', async () => {
    const provider = await startStandIn();
    const dir = await preparedDataDir();
    const model = standInModel(provider);
    const server = await serve({
      config: defineConfig({ agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) } }),
      port: 0,
      dataDir: dir,
      databaseUrl: '',
      logger: false,
    });
    const leaks = await findTestLeaks();
    expect(leaks.length).toBeGreaterThan(0);
    expect(leaks.every((l) => l.startsWith('a pending timer: ') && l.includes('/packages/'))).toBe(true);
    expect(leaks.some((l) => l.includes('/packages/server/src/'))).toBe(true);
    expect(() => assertNoLeaks(leaks)).toThrow(LeakError);
    await server.close();
    rmSync(dir, { recursive: true, force: true });
    expect(pendingSluiceTimers()).toEqual([]);
  });

  it('fails a test that leaves a timer of Sluice code pending, naming where it was set', async () => {
    const timer = systemClock.setTimeout(() => undefined, 60_000);
    const leaks = await findTestLeaks();
    expect(leaks).toHaveLength(1);
    expect(leaks[0]).toMatch(
      /^a pending timer: setTimeout .*\/packages\/sluice\/src\/concurrency\/clock\.ts/,
    );
    systemClock.clearTimeout(timer);
    expect(await findTestLeaks()).toEqual([]);
  });

  it('does not count a timer the test set, one that fired or was cleared, nor a background one-shot', async () => {
    const own = setTimeout(() => undefined, 60_000);
    const background = systemClock.setTimeout(() => undefined, 60_000, { background: true });
    const cleared = systemClock.setTimeout(() => undefined, 60_000);
    systemClock.clearTimeout(cleared);
    let fired = false;
    systemClock.setTimeout(() => (fired = true), 0);
    await until(() => fired, 'the timer firing');
    expect(await findTestLeaks()).toEqual([]);
    clearTimeout(own);
    systemClock.clearTimeout(background);
  });

  itWith({ PostgreSQL: postgres })(
    'fails a test that leaves a database connection open in a registered pool',
    async () => {
      const pool = new pg.Pool({ ...postgres, max: 2 });
      watchForLeaks('a pool', () => poolLeftovers(pool));
      const client = await pool.connect();
      expect(await findTestLeaks()).toEqual(['a pool: 1 connection(s) still open']);
      client.release();
      await pool.end();
      expect(poolLeftovers(pool)).toEqual([]);
    },
  );

  it('fails a test whose registered listener is still listening after its close ran', async () => {
    const listener = createServer();
    await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
    // A close that forgets the listener: the probe after it sees it still listening.
    afterThisTest(
      () => undefined,
      'a listener',
      () => (listener.listening ? ['still listening'] : []),
    );
    expect(await findTestLeaks()).toEqual(['a listener: still listening']);
    await new Promise<void>((resolve) => listener.close(() => resolve()));
  });

  it('reports a close that throws, still runs the closes registered before it, last first', async () => {
    const order: string[] = [];
    afterThisTest(() => void order.push('first registered'), 'the first');
    afterThisTest(() => {
      order.push('second registered');
      throw new Error('the socket was already gone');
    }, 'the second');
    afterThisTest(() => void order.push('third registered'), 'the third');
    expect(await findTestLeaks()).toEqual(['closing the second failed: the socket was already gone']);
    expect(order).toEqual(['third registered', 'second registered', 'first registered']);
  });

  it('reports a close that starts something new while closing', async () => {
    afterThisTest(() => afterThisTest(() => undefined, 'a late start'), 'a close');
    expect(await findTestLeaks()).toEqual(['a late start, registered during the cleanup']);
  });

  it('lets a test that closed everything it started pass', async () => {
    const { call } = await startTestServer({ transport: 'inject' });
    expect((await call('POST', '/agents/echo/runs', { input: 'hi' })).body.status).toBe('succeeded');
    expect(await findTestLeaks()).toEqual([]);
  });
});
