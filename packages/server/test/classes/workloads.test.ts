import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { createConcurrencyLimiter } from 'sluice/concurrency';
import { defineConfig } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import {
  lastUserText,
  ownStandIn,
  standInModel,
  startTestServer,
  until,
  type TestServer,
} from '../helpers.js';

/**
 * Run classes on the provider limiter: with `classes` mapping deferred runs to the `background`
 * workload (ceiling 2) and default runs to `interactive` (2 reserved slots), a flood of deferred
 * runs never has more than 2 requests in flight at the provider, while interactive runs get
 * theirs answered at once. The run-level caps are opened wide (8 deferred workers, 8 running
 * per tenant), so the limiter's workloads are what hold the flood back.
 */

const FLOOD = 8;
const BACKGROUND_CEILING = 2;

let provider: ProviderStandIn;
let call: TestServer['call'];
const limiter = createConcurrencyLimiter({
  name: 'account',
  maxConcurrent: 4,
  workloads: { interactive: { reserved: 2 }, background: { maxConcurrent: BACKGROUND_CEILING } },
});

/** Deferred requests at the stand-in: each waits for the test to let it answer. */
const held: (() => void)[] = [];
let deferredInFlight = 0;
let deferredMaxInFlight = 0;
let interactiveAnswered = 0;

beforeAll(async () => {
  provider = ownStandIn(
    await startProviderStandIn({
      reply: async (r) => {
        const prompt = lastUserText(r);
        if (!prompt.startsWith('deferred')) {
          interactiveAnswered++;
          return { text: `now: ${prompt}`, usage: { input: 1, output: 1 } };
        }
        deferredInFlight++;
        deferredMaxInFlight = Math.max(deferredMaxInFlight, deferredInFlight);
        await new Promise<void>((release) => held.push(release));
        deferredInFlight--;
        return { text: `later: ${prompt}`, usage: { input: 1, output: 1 } };
      },
    }),
  );
  const t = await startTestServer({
    provider,
    config: defineConfig({
      agents: {
        // The agent's own workload is interactive: without `classes`, deferred runs would use it too.
        analyst: createAgent({
          model: standInModel(provider),
          credentials: { apiKey: 'k' },
          concurrency: { limiter, workload: 'interactive' },
        }),
      },
      classes: { default: { workload: 'interactive' }, deferred: { workload: 'background' } },
      settings: { deferredConcurrency: FLOOD, deferredMaxRunningPerTenant: FLOOD, runConcurrency: 2 },
    }),
  });
  call = t.call;
});

afterAll(() => {
  for (const release of held.splice(0)) release();
});

describe('classes on the provider limiter', () => {
  it('holds a deferred flood to its workload ceiling while interactive runs reach the provider at once', async () => {
    const flood = await Promise.all(
      Array.from({ length: FLOOD }, (_, i) =>
        call('POST', '/agents/analyst/runs', { input: `deferred job ${i}`, class: 'deferred' }),
      ),
    );
    expect(flood.map((r) => r.status)).toEqual(Array(FLOOD).fill(202));

    // Every deferred run is running (a worker each), two at the provider, the rest waiting for a
    // background slot: the limiter, not the run caps, is what holds them.
    await until(() => deferredInFlight === BACKGROUND_CEILING, 'two deferred requests at the provider');
    await until(() => {
      const stats = limiter.stats();
      return stats.workloads.background.queued === FLOOD - BACKGROUND_CEILING;
    }, 'the other deferred requests waiting in the background workload');
    expect(limiter.stats().workloads.background.active).toBe(BACKGROUND_CEILING);

    // Interactive runs, inline: answered while every deferred request is still held.
    const interactive = await Promise.all(
      ['first', 'second'].map((name) =>
        call('POST', '/agents/analyst/runs', { input: `interactive ${name}` }),
      ),
    );
    expect(interactive.map((r) => [r.status, r.body.status])).toEqual([
      [200, 'succeeded'],
      [200, 'succeeded'],
    ]);
    expect(interactiveAnswered).toBe(2);
    expect(deferredInFlight).toBe(BACKGROUND_CEILING);

    // Let the deferred requests answer one at a time: each frees a slot for the next, never more.
    let answered = 0;
    while (answered < FLOOD) {
      await until(() => held.length > 0, 'a deferred request at the provider');
      held.shift()!();
      answered++;
      expect(deferredInFlight).toBeLessThanOrEqual(BACKGROUND_CEILING);
    }
    const runs = await call('GET', '/agents/runs?class=deferred&limit=100');
    await until(async () => {
      const list = (await call('GET', '/agents/runs?class=deferred&limit=100')).body.data as {
        status: string;
      }[];
      return list.length === FLOOD && list.every((r) => r.status === 'succeeded');
    }, 'every deferred run to succeed');
    expect(runs.status).toBe(200);
    expect(deferredMaxInFlight).toBe(BACKGROUND_CEILING);
  });

  it('refuses at start a class whose workload an agent limiter lacks, naming the class, workload and agent', async () => {
    const model = standInModel(provider);
    const make = (classes: unknown) => () =>
      defineConfig({
        agents: {
          plain: createAgent({ model, credentials: { apiKey: 'k' } }),
          analyst: createAgent({
            model,
            credentials: { apiKey: 'k' },
            concurrency: { limiter, workload: 'interactive' },
          }),
        },
        classes: classes as never,
      });
    expect(make({ deferred: { workload: 'batch' } })).toThrow(
      /Class `deferred` runs in workload `batch`, which the limiter of agent `analyst` lacks.*interactive.*background/,
    );
    expect(make({ nightly: { workload: 'background' } })).toThrow(
      /`classes` keys to be default or deferred, got `nightly`/,
    );
    expect(make({ deferred: {} })).toThrow(/`classes.deferred.workload`/);
    // An agent without a limiter takes no slots: nothing to map, nothing refused.
    expect(
      make({ default: { workload: 'interactive' }, deferred: { workload: 'background' } }),
    ).not.toThrow();
    // A config that skipped defineConfig is refused as the server starts, before anything listens.
    await expect(
      startTestServer({
        provider,
        config: {
          agents: {
            analyst: createAgent({
              model,
              credentials: { apiKey: 'k' },
              concurrency: { limiter, workload: 'interactive' },
            }),
          },
          classes: { default: { workload: 'chat' } },
        },
      }),
    ).rejects.toThrow(/Class `default` runs in workload `chat`.*agent `analyst`/);
  });
});
