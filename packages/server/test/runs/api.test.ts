import { ownStandIn, startTestServer, type TestServer } from '../helpers.js';
import { beforeAll, describe, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { defineConfig, type RunningServer } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';

let provider: ProviderStandIn;
let t: TestServer;
let server: RunningServer;
const tokens: Record<string, string> = {};

beforeAll(async () => {
  // "stall" makes the model hang (the run stays active); anything else is echoed.
  provider = ownStandIn(
    await startProviderStandIn({
      reply: (r) => {
        const last = String([...r.messages].reverse().find((m) => m.role === 'user')?.content ?? '');
        return last.includes('stall') ? { stall: true } : { text: `echo ${last}` };
      },
    }),
  );
  const model = {
    api: 'openai-completions' as const,
    provider: 'stand-in',
    id: 'm',
    baseUrl: provider.url,
  };
  const config = defineConfig({
    agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) },
    tenants: { small: { maxConcurrentAgentRuns: 1 } },
    // The sync window only ever elapses for runs that stall; a finishing run is answered well within it.
    settings: { maxActivePerTenant: 2, syncTimeoutMs: 3_000, runConcurrency: 2 },
  });
  t = await startTestServer({ provider, config });
  server = t.server;
  for (const [name, who] of Object.entries({
    admin: { tenant: 'acme', project: 'p1', user: 'ann', role: 'admin' },
    reader: { tenant: 'acme', project: 'p1', user: 'rob', role: 'read' },
    other: { tenant: 'globex', project: 'p1', user: 'gus', role: 'member' },
    small: { tenant: 'small', project: 'p1', user: 'sam', role: 'member' },
    paging: { tenant: 'paging', project: 'p1', user: 'pat', role: 'member' },
  } as const)) {
    tokens[name] = await t.token(who);
  }
});

/** A request as `token` (none if not given), with `body` as JSON or `raw` as it is. */
const call = (method: string, path: string, token?: string, body?: unknown, raw?: string) =>
  t.call(method, path, body, token ?? null, { raw });

async function until<T>(get: () => Promise<T>, ok: (v: T) => boolean): Promise<T> {
  for (let i = 0; i < 400; i++) {
    const v = await get();
    if (ok(v)) return v;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('condition not reached');
}

describe('run server over a real socket', () => {
  it('answers /readyz', async () => {
    const response = await fetch(`${server.url}/readyz`);
    expect(response.status).toBe(200);
  });

  it('refuses a missing or unknown token with 401', async () => {
    const none = await call('GET', '/agents/runs');
    expect(none.status).toBe(401);
    expect(none.body.error.type).toBe('authentication_required');
    expect((await call('GET', '/agents/runs', 'sk_nope')).status).toBe(401);
  });

  it('runs inline and answers 200 with the output; another tenant gets 404; a read token cannot create', async () => {
    const created = await call('POST', '/agents/echo/runs', tokens.admin, {
      input: 'hello',
      metadata: { ticket: 7 },
    });
    expect(created.status).toBe(200);
    expect(created.body).toMatchObject({
      object: 'agent.run',
      agent: 'echo',
      status: 'succeeded',
      output: { text: 'echo hello' },
    });
    expect(created.body.metadata).toEqual({ ticket: 7 });
    const read = await call('GET', `/agents/runs/${created.body.id}`, tokens.reader);
    expect(read.body.status).toBe('succeeded');
    const foreign = await call('GET', `/agents/runs/${created.body.id}`, tokens.other);
    expect(foreign.status).toBe(404);
    const forbidden = await call('POST', '/agents/echo/runs', tokens.reader, { input: 'x' });
    expect(forbidden.status).toBe(403);
    expect(forbidden.body.error.type).toBe('permission_denied');
  });

  it('queues with wait: false (202), and a worker runs it to the end', async () => {
    const created = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'later', wait: false });
    expect(created.status).toBe(202);
    expect(created.body.status).toMatch(/queued|running/);
    const done = await until(
      () => call('GET', `/agents/runs/${created.body.id}`, tokens.admin),
      (r) => r.body.status === 'succeeded',
    );
    expect(done.body.output).toEqual({ text: 'echo later' });
  });

  it('answers 202 after the sync window for a slow run, and cancel stops it', async () => {
    const created = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'stall please' });
    expect(created.status).toBe(202);
    expect(created.body.status).toBe('running');
    const canceled = await call('POST', `/agents/runs/${created.body.id}/cancel`, tokens.admin);
    expect(canceled.body.status).toBe('canceled');
  });

  it('over the tenant cap: 429 before any run is created, with the limit, scope, class and an estimated Retry-After', async () => {
    const a = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'stall 1', wait: false });
    const b = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'stall 2', wait: false });
    expect([a.status, b.status]).toEqual([202, 202]);
    const before = (await call('GET', '/agents/runs?limit=1000', tokens.admin)).body.data.length;
    const refused = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'one more' });
    expect(refused.status).toBe(429);
    // Estimated from how fast the tenant's runs finish (runs/retry-after.ts): 1 to 60 s, the
    // same in the body.
    expect(refused.headers.get('retry-after')).toMatch(/^([1-9]|[1-5]\d|60)$/);
    expect(Number(refused.headers.get('retry-after'))).toBe(
      Math.ceil(refused.body.error.retry_after_ms / 1000),
    );
    expect(refused.body.error).toMatchObject({
      type: 'agent_run_concurrency_limit',
      limit_value: 2,
      scope: 'tenant',
      class: 'default',
    });
    expect((await call('GET', '/agents/runs?limit=1000', tokens.admin)).body.data.length).toBe(before);
    // The tenant's own quota (1) is lower than the setting (2): it is the one that applies.
    await call('POST', '/agents/echo/runs', tokens.small, { input: 'stall s', wait: false });
    const small = await call('POST', '/agents/echo/runs', tokens.small, { input: 'x' });
    expect(small.status).toBe(429);
    expect(small.body.error.limit_value).toBe(1);
    for (const run of [a, b]) await call('POST', `/agents/runs/${run.body.id}/cancel`, tokens.admin);
  });

  it("the queue endpoint gives tenant-wide counts and repeats them for the token's project", async () => {
    const a = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'stall q', wait: false });
    await until(
      () => call('GET', `/agents/runs/${a.body.id}`, tokens.admin),
      (r) => r.body.status === 'running',
    );
    const queue = await call('GET', '/agents/runs/queue', tokens.reader);
    expect(queue.status).toBe(200);
    expect(queue.body).toMatchObject({
      object: 'agent.run_queue',
      default: { running: 1, queued: 0, scheduled: 0, limit: 2 },
      deferred: {
        running: 0,
        queued: 0,
        scheduled: 0,
        running_limit: 2,
        queued_limit: 10000,
        oldest_queued_at: null,
      },
      project: { default: { running: 1, queued: 0, scheduled: 0 } },
    });
    // Another tenant sees only its own.
    expect((await call('GET', '/agents/runs/queue', tokens.other)).body.default.running).toBe(0);
    await call('POST', `/agents/runs/${a.body.id}/cancel`, tokens.admin);
  });

  it('pages: 100 by default, at most 1000 whatever is asked, a cursor, and 400 for a bad limit', async () => {
    await server.store.db.query(
      `INSERT INTO agent_runs (id, tenant, project, user_id, agent, mode, status, input)
       SELECT 'run_page_' || g, 'paging', 'p1', 'pat', 'echo', 'queued', 'succeeded', '"x"'::jsonb FROM generate_series(1, 1005) g`,
    );
    const first = await call('GET', '/agents/runs', tokens.paging);
    expect(first.body.data).toHaveLength(100);
    expect(first.body.has_more).toBe(true);
    const big = await call('GET', '/agents/runs?limit=5000', tokens.paging);
    expect(big.body.data).toHaveLength(1000);
    const rest = await call('GET', `/agents/runs?limit=5000&cursor=${big.body.next_cursor}`, tokens.paging);
    expect(rest.body.data).toHaveLength(5);
    expect(rest.body.has_more).toBe(false);
    expect(new Set([...big.body.data, ...rest.body.data].map((r: { id: string }) => r.id)).size).toBe(1005);
    for (const bad of ['-1', 'abc', '1.5']) {
      const r = await call('GET', `/agents/runs?limit=${bad}`, tokens.paging);
      expect(r.status).toBe(400);
      expect(r.body.error.field).toBe('limit');
    }
    expect((await call('GET', '/agents/runs?cursor=zz', tokens.paging)).status).toBe(400);
    expect((await call('GET', '/agents/runs?status=queued,nope', tokens.paging)).status).toBe(400);
  });

  it('bad input is a 400 or 404 that names what is wrong', async () => {
    const malformed = await call('POST', '/agents/echo/runs', tokens.admin, undefined, '{"input": ');
    expect(malformed.status).toBe(400);
    expect(malformed.body.error.type).toBe('invalid_request');
    const unknownField = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'x', colour: 'red' });
    expect(unknownField.status).toBe(400);
    expect(unknownField.body.error).toMatchObject({ field: 'colour' });
    const missing = await call('POST', '/agents/echo/runs', tokens.admin, { wait: true });
    expect(missing.body.error).toMatchObject({ field: 'input' });
    const wrongType = await call('POST', '/agents/echo/runs', tokens.admin, { input: 'x', wait: 'yes' });
    expect(wrongType.body.error).toMatchObject({ field: 'wait' });
    const unknownAgent = await call('POST', '/agents/nobody/runs', tokens.admin, { input: 'x' });
    expect(unknownAgent.status).toBe(404);
    expect(unknownAgent.body.error.message).toContain('nobody');
  });
});
