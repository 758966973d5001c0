import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startTestServer, until } from '../helpers.js';

/**
 * The official client retries a request that timed out, and every 408, 409, 429 and 5xx unless
 * the answer says `x-should-retry: false`. It sends no idempotency key, so each retry of
 * `POST /responses` is a new run: any answer that comes too late, or any refusal the client
 * thinks worth retrying, must be safe to send again.
 */
describe('the openai client retrying', () => {
  it('a held response slower than the client timeout is answered 202 once, not started again by each retry of the client', async () => {
    // The defaults scaled down: the sync window equals the client's timeout, as 600 s and 600 s do.
    const t = await startTestServer({ settings: { syncTimeoutMs: 1_500 } });
    const client = new OpenAI({
      baseURL: `${t.server.url}/api/client/v1`,
      apiKey: t.admin,
      timeout: 1_500,
      maxRetries: 1,
    });
    // A request timeout of its own: the client says it in X-Stainless-Timeout (whole seconds).
    const outcome = await client.responses
      .create({ model: 'agent:echo', input: 'stall' }, { timeout: 1_500 })
      .then(
        (response) => response.status,
        (error: unknown) => (error as Error).constructor.name,
      );
    const runs = (await t.call('GET', '/agents/runs')).body.data as { id: string }[];
    for (const run of runs) await t.call('POST', `/agents/runs/${run.id}/cancel`, {});
    await until(() => t.provider.inFlight === 0, 'the stalled runs stopped');
    // The client says how long it waits (X-Stainless-Timeout): it is answered 202 before then,
    // so it does not time out and retry into a second run.
    expect.soft(outcome).toBe('in_progress');
    expect(runs).toHaveLength(1);
  });

  it('a spend-limit refusal, which will not pass on its own soon, is not retried by the client', async () => {
    const t = await startTestServer({ tenants: { t: { spend: { limitUsd: 1e-12, per: 'month' } } } });
    let requests = 0;
    const client = new OpenAI({
      baseURL: `${t.server.url}/api/client/v1`,
      apiKey: t.admin,
      maxRetries: 2,
      fetch: (url, init) => {
        requests++;
        return fetch(url, init);
      },
    });
    await client.responses.create({ model: 'agent:echo', input: 'spend a little' });
    requests = 0;
    const refused = await client.responses
      .create({ model: 'agent:echo', input: 'again' })
      .catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    expect(refused).toMatchObject({ code: 'spend_limit_exceeded' });
    // Fails: 3. The 429 has no Retry-After (on purpose, errors.ts) but no `x-should-retry: false`
    // either, so the client sends it twice more with its own backoff.
    expect(requests).toBe(1);
  });

  it("the hold is kept under what the caller waits: its X-Stainless-Timeout, or the official client's default 10 minutes", async () => {
    const { windowFor } = await import('../../src/openai/window.js');
    expect(windowFor({}, 600_000)).toBe(600_000);
    expect(windowFor({ 'x-stainless-lang': 'js' }, 600_000)).toBe(570_000);
    expect(windowFor({ 'x-stainless-lang': 'js', 'x-stainless-timeout': '60' }, 600_000)).toBe(57_000);
    expect(windowFor({ 'x-stainless-timeout': '3600' }, 600_000)).toBe(600_000);
    expect(windowFor({ 'x-stainless-timeout': 'soon' }, 5_000)).toBe(5_000);
  });
});
