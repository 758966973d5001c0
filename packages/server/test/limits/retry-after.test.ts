import OpenAI from 'openai';
import { beforeAll, describe, expect, it } from 'vitest';
import { ManualClock } from 'sluice/concurrency';
import { startProviderStandIn } from '@sluice/testkit';
import {
  DepartureHistory,
  estimateRetryAfterMs,
  RETRY_AFTER_UNKNOWN_MS,
  retryAfterSeconds,
} from '../../src/runs/retry-after.js';
import { lastUserText, ownStandIn, startTestServer, until, type TestServer } from '../helpers.js';

describe('the estimate (Little: a run stays about active / departures-per-second)', () => {
  it.each([
    ['no history: nothing read yet', { active: 5, left: 0, spanMs: 0 }, RETRY_AFTER_UNKNOWN_MS],
    ['a span too short to show a rate', { active: 5, left: 3, spanMs: 999 }, RETRY_AFTER_UNKNOWN_MS],
    ['fast departures: 2 active, 4 left in 2 s (0.5 s each)', { active: 2, left: 4, spanMs: 2_000 }, 1_000],
    ['2 active, 1 left in 4 s', { active: 2, left: 1, spanMs: 4_000 }, 8_000],
    ['2 active, 3 left in 5 s', { active: 2, left: 3, spanMs: 5_000 }, 3_333],
    ['very fast: clamped up to 1 s', { active: 1, left: 100, spanMs: 1_000 }, 1_000],
    [
      'slow: 250 active, 2 left in 60 s, clamped down to 60 s',
      { active: 250, left: 2, spanMs: 60_000 },
      60_000,
    ],
    ['none left in a short span: the default, no less', { active: 2, left: 0, spanMs: 3_000 }, 30_000],
    [
      'none left in a long span: at least active x span, clamped',
      { active: 3, left: 0, spanMs: 15_000 },
      45_000,
    ],
    ['none left, many active: clamped to 60 s', { active: 250, left: 0, spanMs: 1_000 }, 60_000],
    ['an empty set still waits for one departure', { active: 0, left: 1, spanMs: 2_000 }, 2_000],
  ])('%s', (_name, departures, expected) => {
    expect(estimateRetryAfterMs(departures)).toBe(expected);
  });

  it('the header rounds up to whole seconds, so a client never comes back before the estimate', () => {
    expect([1_000, 1_001, 3_333, 60_000].map(retryAfterSeconds)).toEqual([1, 2, 4, 60]);
  });

  it('the history reads from its oldest sample in the last minute to its latest read, one sample a second at most', () => {
    const history = new DepartureHistory();
    const at = (t: number, left: number, active = 2) =>
      history.record({
        at: t,
        counts: { active, scheduled: 0, deferred: 0 },
        left: { active: left, scheduled: 0, deferred: 0 },
      });
    expect(history.estimate('active')).toBe(RETRY_AFTER_UNKNOWN_MS);
    at(0, 0);
    at(500, 0); // within a second of the last sample: the latest read, not a sample
    expect(history.estimate('active')).toBe(RETRY_AFTER_UNKNOWN_MS); // 500 ms say nothing yet
    at(4_000, 1);
    expect(history.estimate('active')).toBe(8_000); // 2 x 4 s / 1
    // A minute later the old pace is forgotten: 10 left between 61 s and 64 s.
    at(61_000, 1);
    at(64_000, 11);
    // The base is the last sample at or before the horizon (4 s): 10 left in 60 s, 2 active.
    expect(history.estimate('active')).toBe(12_000);
    at(66_000, 15);
    // Horizon 6 s: the 4 s sample is still the last at or before it.
    expect(history.estimate('active')).toBe(Math.round((2 * 62_000) / 14));
    at(125_000, 15);
    // Horizon 65 s: base 64 s (11 left), 4 left in 61 s.
    expect(history.estimate('active')).toBe(Math.round((2 * 61_000) / 4));
  });
});

describe('a 429 of a cap follows the pace at which runs finish', () => {
  const clock = new ManualClock();
  let t: TestServer;
  let token: string;
  /** Each prompt's answer waits for its own release. */
  const gates = new Map<string, () => void>();
  const waiting = new Map<string, Promise<void>>();
  const gate = (prompt: string) => {
    if (!waiting.has(prompt)) waiting.set(prompt, new Promise<void>((r) => gates.set(prompt, r)));
    return waiting.get(prompt)!;
  };

  beforeAll(async () => {
    const provider = ownStandIn(
      await startProviderStandIn({
        reply: async (r) => {
          const prompt = lastUserText(r);
          await gate(prompt);
          return { text: `done ${prompt}` };
        },
      }),
    );
    t = await startTestServer({
      provider,
      price: { input: 1, output: 1 },
      settings: { maxActivePerTenant: 2 },
      clock,
    });
    token = await t.token({ tenant: 'pace', role: 'member' });
  });

  const post = (input: string) => t.call('POST', '/agents/echo/runs', { input, wait: false }, token);
  let finished = 0;
  /** Lets these runs' model calls answer, and waits until the runs have succeeded. */
  const finish = async (...prompts: string[]) => {
    for (const prompt of prompts) void gate(prompt);
    for (const prompt of prompts) gates.get(prompt)!();
    finished += prompts.length;
    await until(
      async () =>
        (await t.call('GET', '/agents/runs?status=succeeded&limit=100', undefined, token)).body.data
          .length === finished,
      `${prompts.join(', ')} finished`,
    );
  };

  it('no departure yet: 30 s; then 1 run done in 4 s with 2 active: 8 s; then 3 done in 5 s: 4 s (3,333 ms); the openai client sees it', async () => {
    expect((await post('r1')).status).toBe(202);
    expect((await post('r2')).status).toBe(202);
    const first = await post('r3');
    expect(first.status).toBe(429);
    expect(first.retryAfter).toBe('30');
    expect(first.body.error).toMatchObject({
      type: 'agent_run_concurrency_limit',
      scope: 'tenant',
      retry_after_ms: 30_000,
    });

    await finish('r1');
    clock.advance(4_000);
    expect((await post('r3')).status).toBe(202);
    const second = await post('r4');
    expect(second.status).toBe(429);
    expect(second.retryAfter).toBe('8');
    expect(second.body.error!.retry_after_ms).toBe(8_000);

    await finish('r2', 'r3');
    clock.advance(1_000);
    expect((await post('r5')).status).toBe(202);
    expect((await post('r6')).status).toBe(202);
    const third = await post('r7');
    expect(third.status).toBe(429);
    expect(third.retryAfter).toBe('4');
    expect(third.body.error!.retry_after_ms).toBe(3_333);

    const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: token, maxRetries: 0 });
    const limited = await client.responses
      .create({ model: 'agent:echo', input: 'r8', background: true })
      .catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(OpenAI.RateLimitError);
    const error = limited as InstanceType<typeof OpenAI.RateLimitError>;
    expect(error.headers.get('retry-after')).toBe('4');
    expect(error.error).toMatchObject({ code: 'agent_run_concurrency_limit', retry_after_ms: 3_333 });
    await finish('r5', 'r6');
  });
});
