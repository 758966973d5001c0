import { existsSync, statSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';
import { insertRun } from '../../src/runs/lifecycle.js';
import { afterThisTest, postgres, until } from '../helpers.js';
import {
  echoConfig,
  send,
  servingLine,
  slowConfig,
  sluice,
  startServer,
  tempDir,
  testDatabase,
} from './harness.js';
import { itWith } from '../../../../scripts/service-suites.js';

// `node packages/server/bin/sluice.js serve`, as a process manager starts it, signalled or
// failing while it starts. (A SIGTERM once it serves is in ../ops/package.test.ts.)

/** Resolves once `check` holds, looking every 25 ms; for start-up steps of a loaded machine (up to 60 s). */
async function eventually(check: () => boolean, what: string): Promise<void> {
  const giveUpAt = Date.now() + 60_000;
  while (!check()) {
    if (Date.now() > giveUpAt) throw new Error(`${what} not reached`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** A TCP port that accepts connections and closes each at once, counting them: a database that is not up. */
async function deadDatabase(): Promise<{ port: number; attempts(): number }> {
  let attempts = 0;
  const server = net.createServer((socket) => {
    attempts++;
    socket.destroy();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  afterThisTest(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { port: (server.address() as net.AddressInfo).port, attempts: () => attempts };
}

describe('sluice serve, signalled while it starts', () => {
  it('issue 8 item 6: SIGTERM while the config module is still loading ends the process at once with code 0; nothing was opened (no .sluice)', async () => {
    const cwd = tempDir();
    const cli = sluice(['serve', '--port', '0', '--config', slowConfig], { cwd });
    // The module prints this, then waits ten minutes: the signal comes in the middle.
    await cli.waitFor(/config: loading/);
    cli.child.kill('SIGTERM');
    expect(await cli.closed).toEqual({ code: 0, signal: null });
    expect(cli.output()).not.toMatch(servingLine);
    expect(existsSync(join(cwd, '.sluice'))).toBe(false);
  }, 120_000);

  it('issue 8 item 6: SIGTERM while the embedded store opens: code 0 without ever serving, the lock file removed, and the store opens again', async () => {
    const cwd = tempDir();
    const lock = join(cwd, '.sluice', 'db.lock');
    const cli = sluice(['serve', '--port', '0'], { cwd });
    // The lock is the first thing the store writes; PGlite and the migrations come after it.
    await eventually(() => existsSync(lock) || cli.child.exitCode !== null, 'the store opening');
    cli.child.kill('SIGTERM');
    expect(await cli.closed).toEqual({ code: 0, signal: null });
    expect(cli.output()).not.toMatch(servingLine);
    expect(existsSync(lock)).toBe(false);

    const again = sluice(['serve', '--port', '0'], { cwd });
    await again.waitFor(servingLine);
    again.child.kill('SIGTERM');
    expect(await again.closed).toEqual({ code: 0, signal: null });
  }, 180_000);

  itWith({ PostgreSQL: postgres })(
    'issue 8 item 6: SIGTERM while the database is still unreachable at start ends the process with code 0, instead of retrying it for a minute',
    async () => {
      const database = await deadDatabase();
      const provider = await startProviderStandIn();
      afterThisTest(() => provider.close());
      const cli = sluice(['serve', '--port', '0', '--config', echoConfig], {
        env: {
          DATABASE_URL: `postgresql://root@127.0.0.1:${database.port}/sluice`,
          PROVIDER_URL: provider.url,
        },
      });
      await eventually(() => database.attempts() > 0 || cli.child.exitCode !== null, 'a connection attempt');
      cli.child.kill('SIGTERM');
      expect(await cli.closed).toEqual({ code: 0, signal: null });
      expect(cli.output()).not.toMatch(servingLine);
    },
    120_000,
  );
});

describe('sluice serve on a port already taken (L6)', () => {
  itWith({ PostgreSQL: postgres })(
    'L6: a second server on a busy port exits 1 and claims nothing: the queued run stays queued, no node registered',
    async () => {
      const database = await testDatabase();
      const provider = await startProviderStandIn({ reply: () => ({ stall: true }) });
      afterThisTest(() => provider.close());
      const env = { DATABASE_URL: database.url, PROVIDER_URL: provider.url, AGENT_RUN_CONCURRENCY: '1' };
      const first = await startServer(env);
      const { secret: token } = await database.token();
      // The first server's only worker hangs on one run, so the next one waits in the queue.
      const busy = await send(first.url, 'POST', '/api/client/v1/agents/echo/runs', {
        token,
        body: { input: 'busy', wait: false },
      });
      await until(() => provider.inFlight === 1, 'the first run at the provider');
      const queued = await send(first.url, 'POST', '/api/client/v1/agents/echo/runs', {
        token,
        body: { input: 'waiting', wait: false },
      });
      expect([busy.status, queued.status, queued.body.status]).toEqual([202, 202, 'queued']);
      const nodesBefore = await database.rows('SELECT id FROM server_nodes');

      const port = new URL(first.url).port;
      const second = sluice(['serve', '--port', port, '--config', echoConfig], { env });
      expect(await second.closed).toEqual({ code: 1, signal: null });
      expect(second.output()).toContain('EADDRINUSE');
      expect(
        await database.rows('SELECT status, worker FROM agent_runs WHERE id = $1', [queued.body.id]),
      ).toEqual([{ status: 'queued', worker: null }]);
      expect(await database.rows('SELECT id FROM server_nodes')).toEqual(nodesBefore);
    },
    180_000,
  );

  it('L6: with the embedded store, a busy port exits 1, leaves no lock file and claims nothing', async () => {
    const cwd = tempDir();
    const dataDir = join(cwd, '.sluice', 'db');
    const store = await openStore({ dataDir });
    const who = { tokenId: 'tok_x', tenant: 't', project: 'p', user: 'u', role: 'member' as const };
    const run = await store.db.transaction((tx) =>
      insertRun(tx, who, {
        agent: 'writer',
        class: 'default',
        mode: 'queued',
        input: 'x',
        metadata: null,
        worker: '',
      }),
    );
    await store.close();
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    afterThisTest(() => new Promise<void>((resolve) => taken.close(() => resolve())));

    const cli = sluice(['serve', '--port', String((taken.address() as net.AddressInfo).port)], { cwd });
    expect(await cli.closed).toEqual({ code: 1, signal: null });
    expect(cli.output()).toContain('EADDRINUSE');
    expect(existsSync(`${dataDir}.lock`)).toBe(false);
    expect(statSync(dataDir).isDirectory()).toBe(true);

    const reopened = await openStore({ dataDir });
    try {
      const rows = await reopened.db.query('SELECT status, worker FROM agent_runs WHERE id = $1', [run.id]);
      expect(rows.rows).toEqual([{ status: 'queued', worker: null }]);
    } finally {
      await reopened.close();
    }
  }, 180_000);
});

describe('sluice serve with a MODE it does not know', () => {
  it('MODE=staging stops the start with code 1, naming MODE and the value; nothing was opened (no .sluice)', async () => {
    const cwd = tempDir();
    const cli = sluice(['serve', '--port', '0', '--config', echoConfig], { cwd, env: { MODE: 'staging' } });
    expect(await cli.closed).toEqual({ code: 1, signal: null });
    expect(cli.output()).toContain('Expected MODE to be production or development, got `staging`');
    expect(cli.output()).not.toMatch(servingLine);
    expect(existsSync(join(cwd, '.sluice'))).toBe(false);
  });
});
