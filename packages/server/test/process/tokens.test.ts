import { describe, expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, postgres } from '../helpers.js';
import { send, servingLine, sluice, startServer, tempDir, testDatabase, type Proc } from './harness.js';
import { itWith } from '../../../../scripts/service-suites.js';

/** Runs a `sluice` command to its end; its exit and output. */
async function command(args: string[], options: Parameters<typeof sluice>[1]) {
  const proc = sluice(args, options);
  return { exit: await proc.closed, output: proc.output() };
}

/** Stops a serving process with SIGTERM; its whole output. */
async function stopped(proc: Proc): Promise<string> {
  proc.child.kill('SIGTERM');
  expect(await proc.closed).toEqual({ code: 0, signal: null });
  return proc.output();
}

const secretPattern = /\bsk_[\w-]+/;

describe('tokens from the command line', () => {
  it('M6: `sluice serve` prints a first admin token only for a store without one: a second start in the same folder prints none', async () => {
    const cwd = tempDir();
    const first = sluice(['serve', '--port', '0'], { cwd });
    await first.waitFor(servingLine);
    const firstOutput = await stopped(first);
    const minted = secretPattern.exec(firstOutput)?.[0];
    expect(minted).toBeDefined();

    const second = sluice(['serve', '--port', '0'], { cwd });
    await second.waitFor(servingLine);
    const secondOutput = await stopped(second);
    expect(secondOutput).not.toMatch(secretPattern);
    expect(secondOutput).not.toContain('admin token');

    // One token in the store, the first one, listed without its secret.
    const list = await command(['tokens', 'list'], { cwd });
    expect(list.exit).toEqual({ code: 0, signal: null });
    const lines = list.output.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^tok_[0-9a-f]+ {2}tenant=local project=default user=local role=admin created=/);
    expect(list.output).not.toMatch(secretPattern);
  }, 240_000);

  itWith({ PostgreSQL: postgres })(
    'M6, issue 8 item 7: `sluice tokens list [--tenant T]` lists ids, scopes and roles, never a secret',
    async () => {
      const database = await testDatabase();
      const a = await database.token({ tenant: 'acme', role: 'member' });
      const b = await database.token({ tenant: 'bolt', role: 'read' });
      const env = { DATABASE_URL: database.url };

      const all = await command(['tokens', 'list'], { env });
      expect(all.exit).toEqual({ code: 0, signal: null });
      // Token ids are random, so the lines are matched to the tokens by id, not by order.
      const lines = all.output.trim().split('\n');
      expect(lines).toHaveLength(2);
      const lineOf = (id: string) => lines.find((line) => line.startsWith(`${id} `));
      expect(lineOf(a.id)).toMatch(
        new RegExp(`^${a.id} {2}tenant=acme project=p user=u role=member created=\\S`),
      );
      expect(lineOf(b.id)).toMatch(
        new RegExp(`^${b.id} {2}tenant=bolt project=p user=u role=read created=\\S`),
      );
      for (const { secret } of [a, b]) expect(all.output).not.toContain(secret);
      expect(all.output).not.toMatch(secretPattern);

      const one = await command(['tokens', 'list', '--tenant', 'bolt'], { env });
      expect(one.exit).toEqual({ code: 0, signal: null });
      expect(one.output.trim().split('\n')).toEqual([
        expect.stringMatching(new RegExp(`^${b.id} .*tenant=bolt`)),
      ]);
    },
    120_000,
  );

  itWith({ PostgreSQL: postgres })(
    'M6, issue 8 item 7: `sluice tokens revoke ID` takes effect on a running server at once: 401 on the next request, other tokens still work',
    async () => {
      const database = await testDatabase();
      const provider = await startProviderStandIn();
      afterThisTest(() => provider.close());
      const env = { DATABASE_URL: database.url, PROVIDER_URL: provider.url };
      const server = await startServer(env);
      const revoked = await database.token({ user: 'leaver' });
      const kept = await database.token();
      const list = (token: string) => send(server.url, 'GET', '/api/client/v1/agents/runs', { token });
      expect((await list(revoked.secret)).status).toBe(200);
      expect((await list(kept.secret)).status).toBe(200);

      const revoke = await command(['tokens', 'revoke', revoked.id], { env });
      expect(revoke.exit).toEqual({ code: 0, signal: null });
      expect(revoke.output).toContain(`Revoked ${revoked.id}`);

      // The very next request: no cache of the server lets the token through.
      const refused = await list(revoked.secret);
      expect(refused.status).toBe(401);
      expect(refused.body.error).toMatchObject({ type: 'authentication_required' });
      const run = await send(server.url, 'POST', '/api/client/v1/agents/echo/runs', {
        token: revoked.secret,
        body: { input: 'after revoke' },
      });
      expect(run.status).toBe(401);
      expect((await list(kept.secret)).status).toBe(200);
      expect(await database.rows('SELECT id FROM agent_runs')).toEqual([]);

      // Listed as revoked; revoking it again is an error that names it.
      const after = await command(['tokens', 'list'], { env });
      expect(after.output).toMatch(new RegExp(`^${revoked.id} .* revoked=\\S`, 'm'));
      expect(after.output).not.toMatch(new RegExp(`^${kept.id} .* revoked=`, 'm'));
      const again = await command(['tokens', 'revoke', revoked.id], { env });
      expect(again.exit).toEqual({ code: 1, signal: null });
      expect(again.output).toContain(`No live token ${revoked.id}`);
    },
    180_000,
  );
});
