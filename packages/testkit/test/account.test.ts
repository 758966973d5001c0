import OpenAI from 'openai';
import { rateLimitsFromHeaders } from 'sluice';
import { ManualClock } from 'sluice/concurrency';
import { afterEach, describe, expect, it } from 'vitest';
import { startProviderStandIn, until, type ProviderStandIn, type Reply } from '@sluice/testkit';

const open: ProviderStandIn[] = [];
async function standIn(options: Parameters<typeof startProviderStandIn>[0] = {}) {
  const p = await startProviderStandIn(options);
  open.push(p);
  return p;
}
afterEach(async () => {
  for (const p of open.splice(0)) await p.close();
});
const client = (p: ProviderStandIn) => new OpenAI({ baseURL: p.url, apiKey: 'key-1', maxRetries: 0 });

/** Replies that wait until `open()` is called for them, in arrival order. */
function gatedReplies(reply: Reply = { text: 'ok' }) {
  const gates: (() => void)[] = [];
  return {
    reply: () => new Promise<Reply>((resolve) => gates.push(() => resolve(reply))),
    waiting: () => gates.length,
    open: () => gates.shift()!(),
  };
}

/** The prompt `x` as the stand-in counts it: a quarter of `[{"role":"user","content":"x"}]`. */
const promptX = 7;
const ask = (c: OpenAI, maxTokens?: number) =>
  c.chat.completions.create({
    model: 'm',
    messages: [{ role: 'user', content: 'x' }],
    ...(maxTokens === undefined ? {} : { max_tokens: maxTokens }),
  });

async function rateLimitError(
  promise: Promise<unknown>,
): Promise<InstanceType<typeof OpenAI.RateLimitError>> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(OpenAI.RateLimitError);
  return error as InstanceType<typeof OpenAI.RateLimitError>;
}

describe('stand-in as a provider account: requests per minute', () => {
  it("answers past the limit with the SDK's RateLimitError, retry-after and the OpenAI error shape", async () => {
    const clock = new ManualClock();
    const p = await standIn({ limits: { requestsPerMinute: 3 }, clock });
    const c = client(p);
    const remaining: (string | null)[] = [];
    for (let i = 0; i < 3; i++) {
      const { response } = await ask(c).withResponse();
      expect(response.headers.get('x-ratelimit-limit-requests')).toBe('3');
      remaining.push(response.headers.get('x-ratelimit-remaining-requests'));
    }
    expect(remaining).toEqual(['2', '1', '0']);

    const error = await rateLimitError(ask(c));
    expect(error.status).toBe(429);
    // One request comes back every 60 s / 3 = 20 s.
    expect(error.headers?.get('retry-after')).toBe('20');
    expect(error.headers?.get('retry-after-ms')).toBe('20000');
    expect(error.headers?.get('x-ratelimit-remaining-requests')).toBe('0');
    expect(error.headers?.get('x-ratelimit-reset-requests')).toBe('1m0s');
    expect(error.error).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded' });
    expect(p.rateLimited).toBe(1);

    clock.advance(19_999);
    await rateLimitError(ask(c));
    clock.advance(1);
    const { response } = await ask(c).withResponse();
    expect(response.status).toBe(200);
    expect(p.rateLimited).toBe(2);
    expect(p.requests.map((r) => [r.status, r.rateLimited])).toEqual([
      [200, undefined],
      [200, undefined],
      [200, undefined],
      [429, 'requests'],
      [429, 'requests'],
      [200, undefined],
    ]);
  });

  it('sends headers that rateLimitsFromHeaders reads back as the account stands', async () => {
    const clock = new ManualClock();
    const p = await standIn({ limits: { requestsPerMinute: 600, tokensPerMinute: 60_000 }, clock });
    const { response } = await ask(client(p), 93).withResponse();
    expect(rateLimitsFromHeaders(response.headers, clock.now())).toEqual({
      // 1 request of 600 taken: full again in 100 ms; 100 tokens of 60,000: in 100 ms too.
      requests: { limit: 600, remaining: 599, resetMs: 100 },
      tokens: { limit: 60_000, remaining: 59_900, resetMs: 100 },
    });
  });

  it('sends no rate-limit headers without limits', async () => {
    const p = await standIn();
    const { response } = await ask(client(p)).withResponse();
    expect([...response.headers.keys()].filter((k) => k.includes('ratelimit'))).toEqual([]);
    expect(p.rateLimited).toBe(0);
  });
});

describe('stand-in as a provider account: tokens per minute', () => {
  it('charges prompt plus max_tokens at admission and settles to the usage at the end', async () => {
    const clock = new ManualClock();
    const gate = gatedReplies({ text: 'ok', usage: { input: promptX, output: 3 } });
    const p = await standIn({ limits: { tokensPerMinute: 300 }, clock, reply: gate.reply });
    const c = client(p);

    const first = ask(c, 250).withResponse(); // charged 7 + 250: 43 left
    await until(() => gate.waiting() === 1, { message: 'the first request reaches its reply' });
    // 257 do not fit in 43: 214 more are needed, 60 s * 214 / 300 = 42.8 s.
    const refused = await rateLimitError(ask(c, 250));
    expect(refused.headers?.get('retry-after-ms')).toBe('42800');
    expect(refused.headers?.get('retry-after')).toBe('43');
    expect(refused.headers?.get('x-ratelimit-remaining-tokens')).toBe('43');
    expect(refused.error).toMatchObject({ type: 'tokens', code: 'rate_limit_exceeded' });

    gate.open();
    expect((await first).response.headers.get('x-ratelimit-remaining-tokens')).toBe('43');
    await p.idle();
    // Settled to 7 + 3 = 10 used: 290 left, so the same request fits now.
    const second = ask(c, 250).withResponse();
    await until(() => gate.waiting() === 1, { message: 'the second request reaches its reply' });
    gate.open();
    expect((await second).response.headers.get('x-ratelimit-remaining-tokens')).toBe(String(290 - 257));
    expect(p.rateLimited).toBe(1);
  });

  it('refuses a request larger than the whole budget with no retry-after, since it can never fit', async () => {
    const p = await standIn({ limits: { tokensPerMinute: 100 }, clock: new ManualClock() });
    const error = await rateLimitError(ask(client(p), 94)); // 7 + 94 = 101
    expect(error.headers?.get('retry-after')).toBeNull();
    expect(error.headers?.get('retry-after-ms')).toBeNull();
    expect(error.message).toContain('Request too large');
    const { response } = await ask(client(p), 93).withResponse(); // 100 fits exactly
    expect(response.headers.get('x-ratelimit-remaining-tokens')).toBe('0');
  });

  it('keeps the charge of a stream the client cut, and gives its place back', async () => {
    const clock = new ManualClock();
    const p = await standIn({
      limits: { maxConcurrent: 1, tokensPerMinute: 1_000 },
      clock,
      reply: () => ({ stall: true }),
    });
    const controller = new AbortController();
    const stream = await client(p).chat.completions.create(
      { model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens: 93, stream: true },
      { signal: controller.signal },
    );
    await (async () => {
      for await (const _ of stream) controller.abort();
    })().catch(() => undefined);
    await p.idle();
    expect(p.requests[0]).toMatchObject({ aborted: true, status: 200 });
    // The place is free again; the 100 tokens stay spent (nothing was reported to settle them).
    const { response } = await ask(client(p), 0).withResponse();
    expect(response.headers.get('x-ratelimit-remaining-tokens')).toBe(String(1_000 - 100 - promptX));
  });

  it('counts a max_tokens that is not a positive number as no cap', async () => {
    const p = await standIn({ limits: { tokensPerMinute: 1_000 }, clock: new ManualClock() });
    const remaining: (string | null)[] = [];
    for (const max_tokens of ['1e999', -5, null, { a: 1 }]) {
      const response = await fetch(`${p.url}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens }),
      });
      expect(response.status).toBe(200);
      remaining.push(response.headers.get('x-ratelimit-remaining-tokens'));
      await response.arrayBuffer();
      await p.idle();
    }
    // Each is charged its prompt (7) at admission, then settled to its usage: 7 in, and 1 out
    // for the echo "Echo: x".
    expect(remaining).toEqual(['993', '985', '977', '969']);
  });
});

describe('stand-in as a provider account: requests at once', () => {
  it('refuses a request past maxConcurrent and counts its 429s exactly', async () => {
    const gate = gatedReplies();
    const p = await standIn({ limits: { maxConcurrent: 2 }, reply: gate.reply });
    const c = client(p);
    const held = [ask(c), ask(c)];
    await until(() => gate.waiting() === 2, { message: 'two requests reach their reply' });
    const errors = await Promise.all([rateLimitError(ask(c)), rateLimitError(ask(c))]);
    for (const error of errors) {
      expect(error.headers?.get('retry-after')).toBe('1');
      expect(error.headers?.get('retry-after-ms')).toBe('1000');
    }
    expect(p.rateLimited).toBe(2);
    gate.open();
    await held[0];
    await until(() => p.inFlight === 1, { message: 'the first answer ends' });
    const third = ask(c);
    await until(() => gate.waiting() === 2, { message: 'a third request is admitted' });
    gate.open();
    gate.open();
    await Promise.all([held[1], third]);
    expect(p.rateLimited).toBe(2);
    expect(p.requests.filter((r) => r.status === 429).map((r) => r.rateLimited)).toEqual([
      'concurrent',
      'concurrent',
    ]);
  });

  it('frees the place of a request whose connection dropped before any response', async () => {
    const p = await standIn({
      limits: { maxConcurrent: 1 },
      reply: (r) => (r.index === 1 ? { drop: 'before-response' } : { text: 'ok' }),
    });
    await ask(client(p)).catch(() => undefined);
    await p.idle();
    await expect(ask(client(p))).resolves.toMatchObject({ object: 'chat.completion' });
  });
});

describe('stand-in as a provider account: Anthropic protocol', () => {
  const post = (p: ProviderStandIn, maxTokens = 10) =>
    fetch(`${p.anthropicUrl}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'ak' },
      body: JSON.stringify({
        model: 'claude',
        max_tokens: maxTokens,
        messages: [{ role: 'user', content: 'x' }],
      }),
    });

  it("sends Anthropic's headers with RFC 3339 resets, and its rate_limit_error shape", async () => {
    const clock = new ManualClock(Date.UTC(2025, 7, 21, 12, 40, 0));
    const p = await standIn({ limits: { requestsPerMinute: 1, tokensPerMinute: 600 }, clock });
    const first = await post(p);
    await first.arrayBuffer();
    expect(
      Object.fromEntries([...first.headers].filter(([k]) => k.startsWith('anthropic-ratelimit'))),
    ).toEqual({
      'anthropic-ratelimit-requests-limit': '1',
      'anthropic-ratelimit-requests-remaining': '0',
      'anthropic-ratelimit-requests-reset': '2025-08-21T12:41:00.000Z',
      'anthropic-ratelimit-tokens-limit': '600',
      'anthropic-ratelimit-tokens-remaining': String(600 - promptX - 10),
      'anthropic-ratelimit-tokens-reset': '2025-08-21T12:40:01.700Z',
    });
    expect([...first.headers.keys()].filter((k) => k.startsWith('x-ratelimit'))).toEqual([]);

    const second = await post(p);
    expect(second.status).toBe(429);
    expect(second.headers.get('retry-after')).toBe('60');
    expect(await second.json()).toEqual({
      type: 'error',
      error: { type: 'rate_limit_error', message: expect.stringContaining('requests per min') },
    });
    expect(p.rateLimited).toBe(1);
  });
});

describe('stand-in as a provider account: bad limits', () => {
  it.each([
    [{ maxConcurrent: 0 }, 'limits.maxConcurrent', 'a positive integer', '0'],
    [{ maxConcurrent: 1.5 }, 'limits.maxConcurrent', 'a positive integer', '1.5'],
    [{ requestsPerMinute: -1 }, 'limits.requestsPerMinute', 'a positive number', '-1'],
    [{ tokensPerMinute: Number.NaN }, 'limits.tokensPerMinute', 'a positive number', 'NaN'],
    [{ tokensPerMinute: Infinity }, 'limits.tokensPerMinute', 'a positive number', 'Infinity'],
    [{ tokensPerMinute: '100' }, 'limits.tokensPerMinute', 'a positive number', '100'],
  ])('refuses %j naming the field and the value', async (limits, field, expected, value) => {
    await expect(startProviderStandIn({ limits: limits as never })).rejects.toThrow(
      `Expected \`${field}\` to be ${expected}, got \`${value}\``,
    );
  });
});
