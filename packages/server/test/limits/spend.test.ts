import { expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText, until } from '../helpers.js';
import { startAgentServer } from './harness.js';

/** Each provider turn that answers is priced 1,000 + 1,000 tokens at $1 per million: $0.002. */
const TURN_USD = 0.002;
const tokens = { input: 1000, output: 1000 };

/**
 * A server whose `tooler` agent asks for its tool on the first turn (a priced turn), then on the
 * second turn fails (a provider 400) when the prompt says "fail", or stalls when it says "stall".
 * A prompt without "tool" is answered at once, or stalls with "stall".
 */
async function start(tenants: Parameters<typeof startAgentServer>[0]['tenants']) {
  const provider = await startProviderStandIn({
    reply: (r) => {
      const prompt = lastUserText(r);
      const afterTool = r.messages.some((m) => m.role === 'tool');
      if (prompt.includes('tool') && !afterTool) {
        return { toolCalls: [{ name: 'lookup', arguments: {} }], usage: tokens };
      }
      if (prompt.includes('fail')) return { status: 400, message: 'the model refused' };
      if (prompt.includes('stall')) return { stall: true };
      return { text: 'ok', usage: tokens };
    },
  });
  afterThisTest(() => provider.close());
  const lookup = tool({
    name: 'lookup',
    description: 'Looks something up',
    parameters: { type: 'object', properties: {} },
    execute: () => 'found',
  });
  return startAgentServer({
    provider,
    tenants,
    agents: (model) => ({ tooler: createAgent({ model, credentials: { apiKey: 'k' }, tools: [lookup] }) }),
  });
}

it('M3 and item 7: runs that fail or are canceled after a priced turn record its usage, and the spend limit counts it', async () => {
  const { call, token, provider } = await start({ x: { spend: { limitUsd: 0.005, per: 'day' } } });
  const x = await token({ tenant: 'x' });

  const failed = await call('POST', '/agents/tooler/runs', x, { input: 'tool then fail' });
  expect(failed.body).toMatchObject({ status: 'failed', error: { type: 'agent_error' } });
  expect(failed.body.usage).toMatchObject(tokens);
  expect(failed.body.usage.cost).toBeCloseTo(TURN_USD, 9);

  const queued = await call('POST', '/agents/tooler/runs', x, { input: 'tool then stall', wait: false });
  expect(queued.status).toBe(202);
  // The failed run's two requests, then this run's tool turn and its second turn, held open.
  await until(
    () => provider.requests.length === 4 && provider.inFlight === 1,
    'the second turn of the run stalls',
  );
  const canceled = await call('POST', `/agents/runs/${queued.body.id}/cancel`, x);
  expect(canceled.body.status).toBe('canceled');
  expect(canceled.body.usage).toMatchObject(tokens);
  expect(canceled.body.usage.cost).toBeCloseTo(TURN_USD, 9);

  // $0.004 spent of $0.005: one more run is admitted, and spends its turn before failing.
  const third = await call('POST', '/agents/tooler/runs', x, { input: 'tool then fail again' });
  expect(third.status).toBe(200);
  expect(third.body.status).toBe('failed');

  const refused = await call('POST', '/agents/tooler/runs', x, { input: 'hello' });
  expect(refused.status).toBe(429);
  expect(refused.body.error).toMatchObject({ type: 'spend_limit_exceeded', limit_value: 0.005 });
  expect(refused.body.error.spent_usd).toBeCloseTo(3 * TURN_USD, 9);
  expect(refused.body.error.reserved_usd).toBe(0);
}, 120_000);

it('item 7: admission reserves the mean run cost for every active run, and refuses before spent + reserved passes the limit', async () => {
  const { call, token, provider } = await start({ y: { spend: { limitUsd: 0.009, per: 'day' } } });
  const y = await token({ tenant: 'y' });
  // One finished run: the mean cost of a run is now $0.002.
  expect((await call('POST', '/agents/tooler/runs', y, { input: 'hello' })).body.status).toBe('succeeded');

  // $0.002 spent; with k runs active, $0.002 * k is reserved: k = 0..3 stay under $0.009.
  for (let k = 0; k < 4; k++) {
    const admitted = await call('POST', '/agents/tooler/runs', y, { input: `stall ${k}`, wait: false });
    expect(admitted.status, `with ${k} runs active`).toBe(202);
  }
  await until(() => provider.inFlight === 4, 'the four runs are in flight');
  const refused = await call('POST', '/agents/tooler/runs', y, { input: 'one too many', wait: false });
  expect(refused.status).toBe(429);
  expect(refused.body.error.type).toBe('spend_limit_exceeded');
  expect(refused.body.error.spent_usd).toBeCloseTo(TURN_USD, 9);
  expect(refused.body.error.reserved_usd).toBeCloseTo(4 * TURN_USD, 9);
  expect(refused.body.error.message).toContain('reserved');
}, 120_000);
