import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ConcurrencyConfigError } from 'sluice';
import { ConfigLoadError, loadConfig } from '@sluice/server';
import { servingLine, sluice } from '../process/harness.js';

const fixture = fileURLToPath(new URL('./fixtures/limiter-cases.config.ts', import.meta.url));

/** The error loading the fixture with limiter case `name` fails with (the test fails when it loads). */
async function refusal(name: string): Promise<ConfigLoadError> {
  process.env.SLUICE_TEST_LIMITER_CASE = name;
  try {
    await loadConfig(fixture);
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigLoadError);
    return error as ConfigLoadError;
  } finally {
    delete process.env.SLUICE_TEST_LIMITER_CASE;
  }
  throw new Error(`limiter case ${name} was accepted`);
}

describe('a limiter of sluice.config with `rate` and `adaptive`', () => {
  it('loads with budgets and the adaptive limit, which its stats report', async () => {
    const { config } = await loadConfig(fixture);
    const limiter = (config.agents.writer as unknown as { limiter: { stats(): Promise<unknown> } }).limiter;
    expect(await limiter.stats()).toMatchObject({
      limit: 8,
      budgets: {
        requests: { available: 600, capacity: 600 },
        tokens: { available: 60_000, capacity: 60_000 },
      },
    });
  });

  // Each row: the case, the field named, what the field takes, and the value as the message shows it.
  it.each([
    ['negativeTokens', 'rate.tokensPerMinute', 'a positive finite number', '-5'],
    ['zeroRequests', 'rate.requestsPerMinute', 'a positive finite number', '0'],
    ['fractionOfARequest', 'rate.requestsPerMinute', 'a finite number >= 1', '0.5'],
    ['nanRequests', 'rate.requestsPerMinute', 'a positive finite number', 'NaN'],
    ['infiniteTokens', 'rate.tokensPerMinute', 'a positive finite number', 'Infinity'],
    ['stringTokens', 'rate.tokensPerMinute', 'a positive finite number', '"60000"'],
    ['protoRate', 'rate.__proto__', 'a known rate option', '"__proto__"'],
    ['rateAsString', 'rate', 'an object', '"__proto__"'],
    ['misspeltRate', 'rate.tokensPerMinutes', 'a known rate option', '"tokensPerMinutes"'],
    ['adaptiveString', 'adaptive', 'true, false or an object', '"yes"'],
    ['adaptiveBelowFloor', 'adaptive.minConcurrent', 'a whole number between 1 and 8', '0'],
    ['adaptiveAboveMax', 'adaptive.minConcurrent', 'a whole number between 1 and 8', '9'],
    ['protoAdaptive', 'adaptive.__proto__', 'a known adaptive option', '"__proto__"'],
  ])(
    '%s is refused at start, naming the file, the limiter, %s, its limit and the value',
    async (name, field, takes, shown) => {
      const error = await refusal(name);
      const opening = `${fixture}: limiter \`openai\`: Expected \`${field}\` to be ${takes}`;
      const ending = `, got \`${shown}\``;
      expect(error.message.slice(0, opening.length)).toBe(opening);
      expect(error.message.slice(-ending.length)).toBe(ending);
      expect(error.field).toBe(field);
      expect(error.limiter).toBe('openai');
      expect(error.file).toBe(fixture);
      expect(error.cause).toBeInstanceOf(ConcurrencyConfigError);
    },
  );

  it('`sluice serve` with such a config exits 1 before serving, printing what is wrong', async () => {
    const cli = sluice(['serve', '--port', '0', '--config', fixture], {
      env: { SLUICE_TEST_LIMITER_CASE: 'negativeTokens' },
    });
    expect(await cli.closed).toEqual({ code: 1, signal: null });
    expect(cli.output()).toContain(
      'limiter `openai`: Expected `rate.tokensPerMinute` to be a positive finite number, got `-5`',
    );
    expect(cli.output()).not.toMatch(servingLine);
  }, 120_000);
});
