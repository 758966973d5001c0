import { describe, expect, it } from 'vitest';
import { createAgent, createConcurrencyLimiter, type ConcurrencyLimiter } from 'sluice';
import { ManualClock } from 'sluice/concurrency';
import { freshDatabase, postgres, startTestServer, type Body } from '../helpers.js';
import { parseMetrics, sample, scrape } from './ops-helpers.js';

const metricsSecret = 'metrics-secret-0123456789';

/** A limiter with none of the capacity methods (no stats, no subscribe): a custom one. */
function plain(limiter: ConcurrencyLimiter<string>): ConcurrencyLimiter<string> {
  return {
    name: limiter.name,
    acquire: (request) => limiter.acquire(request),
    renew: (lease) => limiter.renew(lease),
    release: (lease) => limiter.release(lease),
  };
}

/**
 * A server whose `openai` limiter has budgets and the adaptive limit, on a clock of the test's
 * (budgets refill with time: a still clock keeps the figures exact), beside a custom limiter.
 */
async function capacityServer() {
  const clock = new ManualClock();
  const openai = createConcurrencyLimiter({
    name: 'openai',
    maxConcurrent: 4,
    rate: { requestsPerMinute: 600, tokensPerMinute: 60_000 },
    adaptive: true,
    clock,
  });
  const custom = plain(createConcurrencyLimiter({ name: 'custom', maxConcurrent: 2 }));
  process.env.SLUICE_METRICS_TOKEN = metricsSecret;
  try {
    const t = await startTestServer({
      databaseUrl: postgres ? await freshDatabase() : undefined,
      agents: (model) => ({
        writer: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter: openai } }),
        other: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter: custom } }),
      }),
    });
    return { t, openai, clock };
  } finally {
    delete process.env.SLUICE_METRICS_TOKEN;
  }
}

async function metricsOf(url: string): Promise<Map<string, number>> {
  const r = await scrape(url, metricsSecret);
  expect(r.status).toBe(200);
  return parseMetrics(r.text);
}

async function overviewOf(url: string): Promise<Body> {
  const r = await fetch(`${url}/api/client/v1/ops/overview`, {
    headers: { authorization: `Bearer ${metricsSecret}` },
  });
  expect(r.status).toBe(200);
  return (await r.json()) as Body;
}

describe('limiter capacity in /metrics and the dashboard data', () => {
  it('shows the effective limit, each budget and the provider throttles the limiter heard; a custom limiter is left out', async () => {
    const { t, openai } = await capacityServer();
    const url = t.server.url;

    let m = await metricsOf(url);
    expect(sample(m, 'sluice_limiter_limit', { limiter: 'openai' })).toBe(4);
    expect(sample(m, 'sluice_limiter_budget_available', { limiter: 'openai', budget: 'requests' })).toBe(600);
    expect(sample(m, 'sluice_limiter_budget_available', { limiter: 'openai', budget: 'tokens' })).toBe(
      60_000,
    );
    expect(sample(m, 'sluice_limiter_provider_throttled_total', { limiter: 'openai' })).toBe(0);
    // Budgets not configured have no series; neither has the custom limiter, which reports nothing.
    expect(m.has('sluice_limiter_budget_available{limiter="openai",budget="inputTokens"}')).toBe(false);
    expect([...m.keys()].filter((k) => k.includes('limiter="custom"'))).toEqual([]);
    expect((await overviewOf(url)).capacity).toEqual([
      {
        limiter: 'openai',
        limit: 4,
        budgets: {
          requests: { available: 600, capacity: 600 },
          tokens: { available: 60_000, capacity: 60_000 },
        },
        throttled: 0,
        lastThrottledAt: null,
      },
    ]);

    // Another client of the same limiter (a gateway, a script) spends from its budgets and
    // reports a 429: the server shows what the limiter now holds, whoever caused it.
    const lease = await openai.acquire({ tokens: { input: 1000, output: 500 } });
    await openai.release(lease, {
      usage: { input: 800, output: 200 },
      provider: { status: 429, retryAfterMs: 5000 },
    });
    const stats = await openai.stats();
    expect(stats.limit).toBeLessThan(4);
    m = await metricsOf(url);
    expect(sample(m, 'sluice_limiter_provider_throttled_total', { limiter: 'openai' })).toBe(1);
    expect(sample(m, 'sluice_limiter_limit', { limiter: 'openai' })).toBe(stats.limit);
    expect(sample(m, 'sluice_limiter_budget_available', { limiter: 'openai', budget: 'requests' })).toBe(599);
    // Settled to the usage: 1,000 tokens taken, not the 1,500 estimated.
    expect(sample(m, 'sluice_limiter_budget_available', { limiter: 'openai', budget: 'tokens' })).toBe(
      59_000,
    );
    const [capacity] = (await overviewOf(url)).capacity as Body[];
    expect(capacity).toMatchObject({
      limiter: 'openai',
      limit: stats.limit,
      budgets: {
        requests: { available: 599, capacity: 600 },
        tokens: { available: 59_000, capacity: 60_000 },
      },
      throttled: 1,
    });
    expect(Date.parse(capacity!.lastThrottledAt as string)).toBeGreaterThan(0);
  });

  it('counts the throttles of a limiter that can be subscribed to, and stops listening when the server closes', async () => {
    const inner = createConcurrencyLimiter({ name: 'listened', maxConcurrent: 1 });
    const listeners = new Set<Parameters<NonNullable<ConcurrencyLimiter['subscribe']>>[0]>();
    // Subscribable but without stats: the throttle counter is there, the limit and budgets not.
    const limiter: ConcurrencyLimiter<string> = {
      ...plain(inner),
      subscribe(listener) {
        listeners.add(listener);
        return () => listeners.delete(listener);
      },
    };
    process.env.SLUICE_METRICS_TOKEN = metricsSecret;
    let t;
    try {
      t = await startTestServer({
        agents: (model) => ({
          a: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
        }),
      });
    } finally {
      delete process.env.SLUICE_METRICS_TOKEN;
    }
    expect(listeners.size).toBe(1);
    const throttled = (status: number) => {
      for (const l of listeners)
        l({
          type: 'provider-throttled',
          limiter: 'listened',
          workload: 'default',
          at: 1,
          status,
          retryAfterMs: 1000,
        });
    };
    throttled(429);
    throttled(529);
    // An event that is not a throttle counts nothing.
    for (const l of listeners)
      l({
        type: 'limit-changed',
        limiter: 'listened',
        workload: 'default',
        at: 2,
        from: 4,
        to: 3,
        reason: 'overload',
      });
    const m = await metricsOf(t.server.url);
    expect(sample(m, 'sluice_limiter_provider_throttled_total', { limiter: 'listened' })).toBe(2);
    expect(m.has('sluice_limiter_limit{limiter="listened"}')).toBe(false);
    expect((await overviewOf(t.server.url)).capacity).toEqual([
      { limiter: 'listened', budgets: {}, throttled: 2, lastThrottledAt: new Date(1).toISOString() },
    ]);
    await t.server.close();
    expect(listeners.size).toBe(0);
  });

  it('leaves out, for one scrape, a limiter whose stats fail, as its slots are', async () => {
    const inner = createConcurrencyLimiter({
      name: 'flaky',
      maxConcurrent: 2,
      rate: { requestsPerMinute: 60 },
    });
    let failing = false;
    const limiter: ConcurrencyLimiter<string> = {
      ...plain(inner),
      stats: () => (failing ? Promise.reject(new Error('database down')) : inner.stats()),
    };
    process.env.SLUICE_METRICS_TOKEN = metricsSecret;
    let t;
    try {
      t = await startTestServer({
        agents: (model) => ({
          a: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
        }),
      });
    } finally {
      delete process.env.SLUICE_METRICS_TOKEN;
    }
    let m = await metricsOf(t.server.url);
    expect(sample(m, 'sluice_limiter_limit', { limiter: 'flaky' })).toBe(2);
    failing = true;
    m = await metricsOf(t.server.url);
    expect(m.has('sluice_limiter_limit{limiter="flaky"}')).toBe(false);
    expect(m.has('sluice_limiter_budget_available{limiter="flaky",budget="requests"}')).toBe(false);
    expect((await overviewOf(t.server.url)).capacity).toEqual([]);
    failing = false;
    m = await metricsOf(t.server.url);
    expect(sample(m, 'sluice_limiter_limit', { limiter: 'flaky' })).toBe(2);
  });
});
