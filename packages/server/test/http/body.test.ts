import { describe, expect, it } from 'vitest';
import { useInjectHarness } from './principals.js';
import { expectError } from './expect-error.js';

// Rows of the review's fuzz table about the create-run body, through `inject` (no socket, no
// workers: a scheduled run stays scheduled, which is what these tests look at).
const h = useInjectHarness();
const create = '/api/client/v1/agents/echo/runs';
const json = { 'content-type': 'application/json' };
const post = (body: unknown) => h.call('POST', create, { body });
const postRaw = (raw: string, headers: Record<string, string> = json) =>
  h.call('POST', create, { raw, headers });

describe('the body as a whole', () => {
  it.each([
    ['[]', '[]'],
    ['null', 'null'],
    ['"str"', 'str'],
    ['42', '42'],
  ])('row 6: a body of %s is a 400 naming the body', async (raw, shown) => {
    const error = expectError(await postRaw(raw), 400, 'invalid_request', 'body');
    expect(error.message).toBe(`Expected the body to be of type object, got \`${shown}\``);
  });

  it('row 7: an empty body, with or without a JSON content type, is a 400 naming the body', async () => {
    expectError(await postRaw(''), 400, 'invalid_request', 'body');
    expectError(await h.call('POST', create), 400, 'invalid_request', 'body');
  });

  it('row 8: a form body is a 415 in the API shape', async () => {
    const error = expectError(
      await postRaw('input=x', { 'content-type': 'application/x-www-form-urlencoded' }),
      415,
      'unsupported_media_type',
    );
    expect(error.message).toMatch(/application\/json/);
  });

  it('row 9: malformed JSON is a 400 that says where the syntax breaks', async () => {
    const error = expectError(await postRaw('{"input":'), 400, 'invalid_request');
    expect(error.message).toMatch(/^The body is not valid JSON: .*JSON/);
  });

  it.each([['{"input":"x","__proto__":{"a":1}}'], ['{"input":"x","constructor":{"prototype":{}}}']])(
    'row 10: a prototype key in %s is a 400 naming it',
    async (raw) => {
      const error = expectError(await postRaw(raw), 400, 'invalid_request', '__proto__');
      expect(error.message).toMatch(/`__proto__`.*`constructor.prototype`/);
    },
  );

  it('row 34: an unknown field is a 400 naming it', async () => {
    const error = expectError(await post({ input: 'x', Input: 'y' }), 400, 'invalid_request', 'Input');
    expect(error.message).toBe('Unknown field `Input` in the body');
  });
});

describe('input', () => {
  it.each([
    ['an empty string', '', 'Expected `input` to be at least 1 character, got ``'],
    ['an empty list', [], 'Expected `input` to have at least 1 item, got 0'],
    [
      'an object',
      {},
      /^Expected `input` to be a non-empty string or a non-empty list of messages .*, got `\{\}`$/,
    ],
  ])('row 14: %s is a 400 naming `input`', async (_name, input, message) => {
    expect(expectError(await post({ input }), 400, 'invalid_request', 'input').message).toMatch(message);
  });

  it.each([[5], [true], [null]])('row 15: input %s is a 400 naming `input` and the value', async (input) => {
    const error = expectError(await post({ input }), 400, 'invalid_request', 'input');
    expect(error.message).toContain(`got \`${String(input)}\``);
  });

  it('row 15: no input is a 400 naming `input`', async () => {
    const error = expectError(await post({ class: 'default' }), 400, 'invalid_request', 'input');
    expect(error.message).toBe('Expected `input` (a string or messages) or `messages`');
  });

  it.each([
    ['L1 (row 16): NUL in input', { input: 'a\u0000b' }, 'input'],
    ['L1 (row 17): a lone surrogate in input', { input: '\ud800' }, 'input'],
    [
      'L1 (row 17): a lone low surrogate in a message',
      { input: [{ role: 'user', content: 'x\udc00' }] },
      'input.0.content',
    ],
    [
      'L1 (row 16): NUL in a content block',
      { input: [{ role: 'user', content: [{ type: 'text', text: '\u0000' }] }] },
      'input.0.content.0.text',
    ],
    ['L1 (row 16): NUL in a metadata value', { input: 'x', metadata: { k: 'a\u0000' } }, 'metadata.k'],
    ['L1 (row 16): NUL in a metadata key', { input: 'x', metadata: { 'k\u0000': 'v' } }, 'metadata'],
  ])('%s is a 400, not a 500', async (_name, body, field) => {
    const error = expectError(await post(body), 400, 'invalid_request', field);
    expect(error.message).toMatch(/hold no U\+0000 character and no unpaired UTF-16 surrogate/);
  });

  it('a surrogate pair (an emoji) is text like any other', async () => {
    expect((await post({ input: 'hi \ud83d\ude00', class: 'deferred' })).status).toBe(202);
  });

  it.each([[1_000], [10_000], [50_000], [200_000]])(
    'L1 (row 18): input nested %i levels deep is a 400, not a 500',
    async (depth) => {
      const raw = `{"input":${'['.repeat(depth)}${']'.repeat(depth)}}`;
      const error = expectError(await postRaw(raw), 400, 'invalid_request', 'input.0');
      expect(error.message).toMatch(/^Expected `input.0` to be of type object, got `\[/);
    },
  );
});

describe('class, wait and delay_seconds', () => {
  it.each([['Deferred'], [''], [null], [['deferred']], [1]])(
    'row 20: class %j is a 400 naming `class`',
    async (value) => {
      const error = expectError(await post({ input: 'x', class: value }), 400, 'invalid_request', 'class');
      expect(error.message).toMatch(
        /^Expected `class` to (be one of "default", "deferred"|be of type string), got `/,
      );
    },
  );

  it.each([['false'], [0], [null]])('row 21: wait %j is a 400 naming `wait`', async (value) => {
    const error = expectError(await post({ input: 'x', wait: value }), 400, 'invalid_request', 'wait');
    expect(error.message).toBe(`Expected \`wait\` to be of type boolean, got \`${String(value)}\``);
  });

  it.each([
    [-1, 'be at least 0'],
    [31_536_001, 'be at most 31536000'],
    ['10', 'be of type number'],
    [1e308, 'be at most 31536000'],
    [null, 'be of type number'],
  ])('row 22: delay_seconds %j is a 400 naming the field, the limit and the value', async (value, rule) => {
    const error = expectError(
      await post({ input: 'x', delay_seconds: value }),
      400,
      'invalid_request',
      'delay_seconds',
    );
    expect(error.message).toBe(`Expected \`delay_seconds\` to ${rule}, got \`${String(value)}\``);
  });

  it.each([
    ['0', '{"input":"x","delay_seconds":0}'],
    ['-0', '{"input":"x","delay_seconds":-0}'],
  ])('row 23: delay_seconds %s is a run scheduled for now', async (_name, raw) => {
    const answer = await postRaw(raw);
    expect(answer.status).toBe(202);
    expect(answer.body).toMatchObject({ status: 'scheduled' });
    expect(answer.body!.scheduled_for - answer.body!.created_at).toBeLessThanOrEqual(1);
  });
});

describe('run_at (L2)', () => {
  const nowS = () => Math.floor(Date.now() / 1000);

  it.each([[1e13], [-1e12], [1.5], [253_402_300_800]])(
    'row 24: run_at %s is a 400 naming `run_at`',
    async (value) => {
      const error = expectError(await post({ input: 'x', run_at: value }), 400, 'invalid_request', 'run_at');
      expect(error.message).toContain(`got \`${value}\``);
    },
  );

  it.each([['+275760-09-13T00:00:00Z'], [1e11]])(
    'row 25: run_at %s, past the one-year horizon, is a 400',
    async (value) => {
      const error = expectError(await post({ input: 'x', run_at: value }), 400, 'invalid_request', 'run_at');
      expect(error.message).toContain(String(value));
    },
  );

  it('row 25: run_at a day past the horizon is a 400 naming the limit and the value', async () => {
    const value = nowS() + 366 * 24 * 3600;
    const error = expectError(await post({ input: 'x', run_at: value }), 400, 'invalid_request', 'run_at');
    expect(error).toMatchObject({ limit_value: 365 * 24 * 3600 });
    expect(error.message).toBe(`Expected \`run_at\` to be at most one year ahead, got \`${value}\``);
  });

  it.each([[0], ['1970-01-01T00:00:00Z']])('row 26: run_at %j, in the past, is due now', async (value) => {
    const before = nowS();
    const answer = await post({ input: 'x', class: 'deferred', run_at: value });
    expect(answer.status).toBe(202);
    expect(answer.body!.scheduled_for).toBeGreaterThanOrEqual(before);
    expect(answer.body!.scheduled_for).toBeLessThanOrEqual(nowS());
  });

  it.each([['2030-01-01T00:00'], ['1/2/2030'], ['2030'], ['0'], ['next tuesday'], ['2030-01-01 00:00:00Z']])(
    'row 27: run_at %j (no RFC 3339 with an offset) is a 400 naming the forms and the value',
    async (value) => {
      const error = expectError(await post({ input: 'x', run_at: value }), 400, 'invalid_request', 'run_at');
      expect(error.message).toBe(
        `Expected \`run_at\` to be an RFC 3339 time with an offset (e.g. 2030-01-01T09:00:00Z) or whole epoch seconds, got \`${value}\``,
      );
    },
  );

  it('row 27: a day that is not in the calendar (30 February) is a 400', async () => {
    const now = new Date();
    const year = now.getUTCMonth() < 1 ? now.getUTCFullYear() : now.getUTCFullYear() + 1;
    const value = `${year}-02-30T00:00:00Z`;
    const error = expectError(await post({ input: 'x', run_at: value }), 400, 'invalid_request', 'run_at');
    expect(error.message).toBe(`Expected \`run_at\` to be a valid RFC 3339 date-time, got \`${value}\``);
  });

  it.each([[true], [null], [{}]])('row 28: run_at %j is a 400', async (value) => {
    expectError(await post({ input: 'x', run_at: value }), 400, 'invalid_request', 'run_at');
  });

  it('row 28: run_at and delay_seconds together are a 400', async () => {
    const error = expectError(
      await post({ input: 'x', run_at: nowS() + 60, delay_seconds: 60 }),
      400,
      'invalid_request',
      'run_at',
    );
    expect(error.message).toMatch(/`run_at` or `delay_seconds`, not both/);
  });

  it('an RFC 3339 time with an offset, or whole epoch seconds, within the year schedules the run then', async () => {
    const at = nowS() + 3600;
    const utc = new Date(at * 1000).toISOString().replace('.000Z', 'Z');
    // The same instant written two hours ahead of UTC.
    const east = new Date((at + 7200) * 1000).toISOString().replace('.000Z', '+02:00');
    for (const value of [at, utc, east]) {
      const answer = await post({ input: 'x', class: 'deferred', run_at: value });
      expect(answer.status).toBe(202);
      expect(answer.body).toMatchObject({ status: 'scheduled', scheduled_for: at });
    }
  });
});

describe('cancel takes no body', () => {
  it('POST cancel with no body, with or without a JSON content type, is accepted', async () => {
    const run = await h.call('POST', create, {
      body: { input: 'x', run_at: Math.floor(Date.now() / 1000) + 3600 },
    });
    expect(run.status).toBe(202);
    const cancel = `/api/client/v1/agents/runs/${run.body!.id}/cancel`;
    const bare = await h.call('POST', cancel);
    expect(bare.status).toBe(200);
    const typed = await h.call('POST', cancel, { raw: '', headers: json });
    expect(typed.status).toBe(200);
    expect(typed.body).toMatchObject({ id: run.body!.id });
  });
});
