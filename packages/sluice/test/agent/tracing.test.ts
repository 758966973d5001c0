import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

// The runtime's spans with an SDK registered: parents across pi-agent-core's loop, parallel tool
// calls and child agents started inside them (context propagation). The agents run in a plain
// Node process (fixtures/traced-runs.ts), which prints the finished spans.

interface Span {
  name: string;
  id: string;
  traceId: string;
  parent?: string;
  attributes: Record<string, unknown>;
}

const script = fileURLToPath(new URL('./fixtures/traced-runs.ts', import.meta.url));
const repo = fileURLToPath(new URL('../../../../', import.meta.url));

describe('runtime spans', () => {
  it('nest run → turn → provider request and tool call; a child agent run started by a tool nests under that tool call, for parallel calls too', async () => {
    const { stdout } = await promisify(execFile)(
      process.execPath,
      ['--conditions=@sluice/source', '--import', 'tsx', script],
      { cwd: repo, env: { ...process.env, NODE_OPTIONS: '' } },
    );
    expect(stdout).toContain('answer parent answer');
    const spans = JSON.parse(/^spans (.*)$/m.exec(stdout)![1]!) as Span[];
    const parentOf = (s: Span) => spans.find((p) => p.id === s.parent);
    const named = (name: string) => spans.filter((s) => s.name === name);
    const runs = named('sluice.agent.run');
    expect(runs).toHaveLength(3);
    const root = runs.find((r) => r.attributes['gen_ai.request.model'] === 'parent')!;
    expect(root.parent).toBeUndefined();
    expect(root.attributes).toMatchObject({
      'sluice.limiter': 'shared',
      'sluice.turns': 2,
      'sluice.requests': 2,
    });

    const rootTurns = named('sluice.turn').filter((t) => parentOf(t) === root);
    expect(rootTurns.map((t) => t.attributes['sluice.turn.index']).sort()).toEqual([0, 1]);
    const firstTurn = rootTurns.find((t) => t.attributes['sluice.turn.index'] === 0)!;

    const calls = named('sluice.tool.call');
    expect(calls).toHaveLength(2);
    for (const call of calls) {
      expect(parentOf(call)).toBe(firstTurn);
      expect(call.attributes).toMatchObject({ 'sluice.tool.name': 'ask', 'sluice.tool.outcome': 'ok' });
    }
    // Each child run hangs under its own call, though both calls ran at once.
    const children = runs.filter((r) => r !== root);
    expect(new Set(children.map(parentOf))).toEqual(new Set(calls));
    for (const childRun of children) {
      // A child on its parent's limiter, one turn, one request under it.
      expect(childRun.attributes['sluice.limiter']).toBe('shared');
      expect(childRun.attributes['sluice.agent.parent_run_id']).toBe(root.attributes['sluice.agent.run_id']);
      const [turn] = named('sluice.turn').filter((t) => parentOf(t) === childRun);
      const requests = named('sluice.provider.request').filter((r) => parentOf(r) === turn);
      expect(requests).toHaveLength(1);
      expect(requests[0]!.attributes['sluice.slot_wait_ms']).toEqual(expect.any(Number));
    }
    for (const request of named('sluice.provider.request'))
      expect(named('sluice.turn')).toContain(parentOf(request));

    expect(new Set(spans.map((s) => s.traceId)).size).toBe(1);
    expect(JSON.stringify(spans.map((s) => s.attributes))).not.toContain('secret prompt text');
  });
});
