import { expect, it } from 'vitest';
import { createAgent, tool, type ConcurrencyEvent } from 'sluice';
import { useAgentFixture } from './fixture.js';

const f = useAgentFixture();

it('50 runs with nested agents on maxConcurrent: 4 and two workloads: the provider never sees more than 4', async () => {
  // Parents ask for two child answers, then answer; children answer at once. Every response
  // takes a little while, so requests pile up at the limiter.
  const provider = await f.provider({
    latencyMs: 15,
    reply: (r) => {
      const system = String(r.messages.find((m) => m.role === 'system')?.content ?? '');
      if (system.includes('researcher')) return { text: 'a fact' };
      const results = r.messages.filter((m) => m.role === 'tool');
      if (results.length === 0) {
        return {
          toolCalls: [
            { name: 'research', arguments: { topic: 'a' } },
            { name: 'research', arguments: { topic: 'b' } },
          ],
        };
      }
      return { text: `report from ${results.length} facts` };
    },
  });
  const limiter = f.limiter({
    name: 'shared',
    maxConcurrent: 4,
    workloads: { interactive: { reserved: 1, priority: 10 }, background: { maxConcurrent: 3 } },
  });
  const model = f.model(provider);
  const { credentials, clock } = f;
  const researcher = createAgent({ model, credentials, clock, instructions: 'You are a researcher.' });
  const writer = createAgent({
    model,
    credentials,
    clock,
    instructions: 'You are a writer.',
    concurrency: { limiter, workload: 'background' },
    tools: [
      tool<{ topic: string }>({
        name: 'research',
        description: 'Ask the researcher',
        parameters: { type: 'object', properties: { topic: { type: 'string' } }, required: ['topic'] },
        execute: async ({ topic }) => (await researcher.run({ prompt: topic })).text,
      }),
    ],
  });

  const events: ConcurrencyEvent[] = [];
  let peakInteractive = 0;
  let peakBackground = 0;
  const onConcurrency = (e: ConcurrencyEvent) => {
    events.push(e);
    const s = limiter.stats();
    peakInteractive = Math.max(peakInteractive, s.workloads.interactive.active);
    peakBackground = Math.max(peakBackground, s.workloads.background.active);
  };
  const runs = Array.from({ length: 50 }, (_, i) =>
    writer.run({
      prompt: `topic ${i}`,
      concurrency: { workload: i % 5 === 0 ? 'interactive' : 'background' },
      events: { onConcurrency },
    }),
  );
  const results = await Promise.all(runs);

  expect(results.every((r) => r.text === 'report from 2 facts')).toBe(true);
  // 50 runs x (2 parent turns + 2 child requests)
  expect(provider.requests).toHaveLength(200);
  expect(provider.peakInFlight).toBeGreaterThan(1);
  expect(provider.peakInFlight).toBeLessThanOrEqual(4);
  // Background never took the interactive reservation.
  expect(peakBackground).toBeLessThanOrEqual(3);
  expect(peakInteractive).toBeGreaterThan(0);
  // Children ran in their parent's workload, with the lineage on every event.
  const childAcquired = events.filter((e) => e.type === 'acquired' && e.parentRunId !== undefined);
  expect(childAcquired).toHaveLength(100);
  for (const e of childAcquired) {
    const parentRun = events.find((p) => p.type === 'acquired' && p.runId === e.parentRunId);
    expect(e.workload).toBe(parentRun!.workload);
    expect(e.rootRunId).toBe(e.parentRunId);
  }
}, 60_000);
