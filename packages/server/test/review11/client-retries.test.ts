import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { settingDefaults } from '@sluice/server';
import { startTestServer, until } from '../helpers.js';

/**
 * The official client retries a request that timed out, and every 408, 409, 429 and 5xx unless
 * the answer says `x-should-retry: false`. It sends no idempotency key, so each retry of
 * `POST /responses` is a new run: any answer that comes too late, or any refusal the client
 * thinks worth retrying, must be safe to send again.
 */
describe('review11: the openai client retrying', () => {
  it("the default sync window is shorter than the client's default timeout, so a slow response is answered 202 before the client gives up", () => {
    // Both are 10 minutes: the client's timer starts before the request is sent, the server's
    // once the run is admitted, so the client always gives up first (and retries, see below).
    // Fails: 600000 is not less than 600000.
    expect(settingDefaults.syncTimeoutMs).toBeLessThan(OpenAI.DEFAULT_TIMEOUT);
  });

  it('a held response slower than the client timeout is answered 202 once, not started again by each retry of the client', async () => {
    // The defaults scaled down: the sync window equals the client's timeout, as 600 s and 600 s do.
    const t = await startTestServer({ settings: { syncTimeoutMs: 1_500 } });
    const client = new OpenAI({
      baseURL: `${t.server.url}/api/client/v1`,
      apiKey: t.admin,
      timeout: 1_500,
      maxRetries: 1,
    });
    const outcome = await client.responses.create({ model: 'agent:echo', input: 'stall' }).then(
      (response) => response.status,
      (error: unknown) => (error as Error).constructor.name,
    );
    const runs = (await t.call('GET', '/agents/runs')).body.data as { id: string }[];
    for (const run of runs) await t.call('POST', `/agents/runs/${run.id}/cancel`, {});
    await until(() => t.provider.inFlight === 0, 'the stalled runs stopped');
    // Fails: 'APIConnectionTimeoutError', and two runs: the first timed out at the client, the
    // retry made a second one (the client sends X-Stainless-Timeout, which the server could
    // keep under, but the wait is AGENT_SYNC_TIMEOUT_MS whatever the caller will wait).
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
});
