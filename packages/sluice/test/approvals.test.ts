import { describe, expect, it } from 'vitest';
import { createAgent, tool, type PausedRun, type RunResult, type ToolEvent } from 'sluice';
import type { StandInRequest } from '@sluice/testkit';
import { useAgentFixture } from './agent/fixture.js';

const f = useAgentFixture();

/** What the model was told about each call: the text of every tool result it got, by call id. */
function toolResults(request: StandInRequest): Record<string, string> {
  const out: Record<string, string> = {};
  for (const m of request.messages)
    if (m.role === 'tool')
      out[m.tool_call_id!] = typeof m.content === 'string' ? m.content : JSON.stringify(m.content);
  return out;
}

/** The first turn calls `transfer` (guarded) and `lookup` (not); the next one answers with what it was told. */
const script = (request: StandInRequest) => {
  const results = toolResults(request);
  if (Object.keys(results).length === 0)
    return {
      text: 'Checking. ',
      toolCalls: [
        { id: 'call_t', name: 'transfer', arguments: { amount: 500 } },
        { id: 'call_l', name: 'lookup', arguments: {} },
      ],
    };
  return { text: `told: ${results.call_t} | ${results.call_l}` };
};

function bankTools(
  log: string[],
  needsApproval: boolean | ((args: { amount: number }) => boolean | Promise<boolean>),
) {
  return [
    tool<{ amount: number }>({
      name: 'transfer',
      description: 'moves money',
      parameters: { type: 'object', properties: { amount: { type: 'number' } }, required: ['amount'] },
      needsApproval,
      execute: ({ amount }) => {
        log.push(`transfer ${amount}`);
        return `sent ${amount}`;
      },
    }),
    tool({
      name: 'lookup',
      description: 'reads the balance',
      parameters: { type: 'object', properties: {} },
      execute: () => {
        log.push('lookup');
        return 'balance 900';
      },
    }),
  ];
}

function paused(result: RunResult): PausedRun {
  expect(result.status).toBe('requires_action');
  return result as PausedRun;
}

describe('approvals in the runtime', () => {
  it('pauses before a guarded call, holding no slot; runs the other call of the turn; resumes from stored JSON', async () => {
    const p = await f.provider({ reply: script });
    const limiter = f.limiter();
    const log: string[] = [];
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      concurrency: { limiter },
      tools: bankTools(log, true),
    });
    const heard: ToolEvent[] = [];
    const first = paused(await agent.run({ prompt: 'pay rent', events: { onTool: (e) => heard.push(e) } }));
    expect(first.pendingToolCalls).toEqual([{ id: 'call_t', name: 'transfer', arguments: { amount: 500 } }]);
    expect(log).toEqual(['lookup']);
    // The guarded call neither started nor ended: only the call that ran is heard.
    expect(heard.map((e) => `${e.type} ${e.name}`)).toEqual(['started lookup', 'completed lookup']);
    expect(first.text).toBe('Checking. ');
    expect(first.usage.requests).toBe(1);
    expect((await limiter.stats()).active).toBe(0);
    expect(p.requests).toHaveLength(1);
    // The state is plain JSON: it survives being stored and read back.
    const stored = JSON.parse(JSON.stringify(first.state)) as PausedRun['state'];

    const heardAfter: ToolEvent[] = [];
    const done = await agent.resume({
      paused: stored,
      decisions: [{ toolCallId: 'call_t', approved: true }],
      events: { onTool: (e) => heardAfter.push(e) },
    });
    expect(done.status).toBe('completed');
    expect(log).toEqual(['lookup', 'transfer 500']);
    expect(done.text).toBe('told: sent 500 | balance 900');
    expect(heardAfter.map((e) => `${e.type} ${e.name}`)).toEqual(['started transfer', 'completed transfer']);
    // Usage covers the whole run: both provider requests.
    expect(done.usage.requests).toBe(2);
    expect(p.requests).toHaveLength(2);
    // The resumed conversation holds the prompt, both turns and both results, in order.
    expect((done.messages as { role: string }[]).map((m) => m.role)).toEqual([
      'user',
      'assistant',
      'toolResult',
      'toolResult',
      'assistant',
    ]);
  });

  it('a declined call does not run; the model is told it was declined, with the reason', async () => {
    const p = await f.provider({ reply: script });
    const log: string[] = [];
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: bankTools(log, true),
    });
    const first = paused(await agent.run({ prompt: 'pay rent' }));
    const done = await agent.resume({
      paused: first.state,
      decisions: [{ toolCallId: 'call_t', approved: false, reason: 'over the monthly budget' }],
    });
    expect(log).toEqual(['lookup']);
    expect(done.status).toBe('completed');
    expect(done.text).toMatch(
      /^told: The user declined this call to transfer; it did not run\. Reason: over the monthly budget \| balance 900$/,
    );
  });

  it('a check of the arguments decides; one that throws counts as needing approval', async () => {
    const p = await f.provider({ reply: script });
    const log: string[] = [];
    const seen: unknown[] = [];
    const small = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: bankTools(log, async (args) => {
        seen.push(args);
        return args.amount > 1000;
      }),
    });
    const result = await small.run({ prompt: 'pay rent' });
    expect(result.status).toBe('completed');
    expect(seen).toEqual([{ amount: 500 }]);
    expect(log.sort()).toEqual(['lookup', 'transfer 500']);

    const broken = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: bankTools([], () => {
        throw new Error('policy service down');
      }),
    });
    expect(paused(await broken.run({ prompt: 'pay rent' })).pendingToolCalls.map((c) => c.id)).toEqual([
      'call_t',
    ]);
  });

  it('refuses decisions that do not answer each pending call exactly once, naming the field, before sending anything', async () => {
    const p = await f.provider({ reply: script });
    const agent = createAgent({
      model: f.model(p),
      credentials: f.credentials,
      clock: f.clock,
      tools: bankTools([], true),
    });
    const { state } = paused(await agent.run({ prompt: 'pay rent' }));
    const sent = p.requests.length;
    await expect(agent.resume({ paused: state, decisions: [] })).rejects.toThrow(
      /`decisions` to be an answer for every pending call \(missing: call_t\)/,
    );
    await expect(
      agent.resume({ paused: state, decisions: [{ toolCallId: 'call_x', approved: true }] }),
    ).rejects.toThrow(
      /`decisions\[0\]\.toolCallId` to be one of the pending calls \(call_t\), got `"call_x"`/,
    );
    await expect(
      agent.resume({
        paused: state,
        decisions: [
          { toolCallId: 'call_t', approved: true },
          { toolCallId: 'call_t', approved: false },
        ],
      }),
    ).rejects.toThrow(/`decisions\[1\]\.toolCallId` to be a call not answered before/);
    await expect(
      agent.resume({ paused: state, decisions: [{ toolCallId: 'call_t', approved: 'yes' as never }] }),
    ).rejects.toThrow(/`decisions\[0\]\.approved` to be true or false/);
    await expect(
      agent.resume({
        paused: { ...state, version: 2 as never },
        decisions: [{ toolCallId: 'call_t', approved: true }],
      }),
    ).rejects.toThrow(/`paused\.version` to be 1/);
    expect(p.requests.length).toBe(sent);
  });

  it('a tool with a needsApproval that is neither boolean nor function is refused at definition', () => {
    expect(() =>
      tool({
        name: 'x',
        description: 'x',
        parameters: { type: 'object' },
        needsApproval: 'always' as never,
        execute: () => 'x',
      }),
    ).toThrow(/`tool\.needsApproval` of `x` to be a boolean or a function, got `always`/);
  });
});
