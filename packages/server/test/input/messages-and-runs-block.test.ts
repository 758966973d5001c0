import { describe, expect, it } from 'vitest';
import type { RunsConfig } from '@sluice/server';
import { startTestServer } from '../helpers.js';

describe('messages a run cannot use', () => {
  it('messages with no user or assistant message get 400 naming `messages`, not an admitted run that fails', async () => {
    const t = await startTestServer();
    const r = await t.call('POST', '/agents/echo/runs', {
      messages: [{ role: 'system', content: 'You are terse.' }],
    });
    // Fails: 200 with a run `failed` / agent_error "The agent failed (TypeError)", counted
    // against the tenant's quota and caps.
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ type: 'invalid_request', param: 'messages' });
    expect((await t.call('GET', '/agents/runs')).body.data).toHaveLength(0);
  });
});

describe('the runs block of a config', () => {
  it('a key of `runs` that names no setting (the spec spelling `timeout`, snake_case) stops the start instead of being ignored', async () => {
    // An operator who writes the bounded-runs spelling gets no run timeout and no per-user
    // cap, silently: resolveSettings (settings.ts) reads only the keys it knows.
    const runs = { timeout: 300, max_concurrent_per_user: 1 } as unknown as RunsConfig;
    const outcome = await startTestServer({ runs }).then(
      () => 'started, the keys ignored',
      (error: unknown) => String(error),
    );
    // Fails: 'started, the keys ignored'.
    expect(outcome).toMatch(/runs\.(timeout|max_concurrent_per_user)/);
  });
});
