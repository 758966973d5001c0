// What a child run takes from its parent (the spec's "Nested runs"): the parent's cancellation,
// the parent's workload on the parent's limiter unless the run picks one, and nothing of the
// parent's limiter when the child agent has a limiter of its own. Each test holds the child's
// provider request open at the stand-in (a real socket) and looks at the limiters while it is
// there, then lets it go; no sleeps.
import { describe, expect, it } from 'vitest';
import { createAgent, tool } from 'sluice';
import type { StandInRequest } from '@sluice/testkit';
import { eventLog, until, useAgentFixture } from './fixture.js';

const f = useAgentFixture();

/** A promise with its resolver, for holding a reply until the test lets it go. */
function deferred<T = void>() {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

const systemOf = (r: StandInRequest) => String(r.messages.find((m) => m.role === 'system')?.content ?? '');

/**
 * A stand-in on which a parent asks its `ask_child` tool once and then answers with what it got;
 * the child's request is answered by `child` (held by the test).
 */
async function parentAndChild(child: (r: StandInRequest) => Promise<{ text: string }> | { stall: true }) {
  return f.provider({
    reply: (r) => {
      if (systemOf(r).includes('child')) return child(r);
      if (systemOf(r).includes('plain')) return { text: 'a plain answer' };
      const result = r.messages.find((m) => m.role === 'tool');
      if (!result) return { toolCalls: [{ name: 'ask_child', arguments: {} }] };
      return { text: `parent got ${String(result.content)}` };
    },
  });
}

const askChild = (run: () => Promise<{ text: string }>) =>
  tool({
    name: 'ask_child',
    description: 'Ask the child agent',
    parameters: { type: 'object', properties: {} },
    execute: async () => (await run()).text,
  });

describe('a child run', () => {
  it("is cancelled by its parent's signal: the child's provider request is aborted at the provider (C34)", async () => {
    const p = await parentAndChild(() => ({ stall: true }));
    const limiter = f.limiter({ name: 'shared', maxConcurrent: 1 });
    const model = f.model(p);
    const { credentials, clock } = f;
    const child = createAgent({ model, credentials, clock, instructions: 'You are the child.' });
    let childOutcome: unknown;
    const parent = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the parent.',
      concurrency: { limiter },
      tools: [
        askChild(async () => {
          try {
            return await child.run({ prompt: 'a fact, please' });
          } catch (error) {
            childOutcome = error;
            throw error;
          }
        }),
      ],
    });
    const controller = f.controller();
    const run = parent.run({ prompt: 'go', signal: controller.signal }).catch((e: unknown) => e);
    // The parent's first request answered with the tool call, the child's request is open.
    await until(() => p.requests.length === 2 && p.inFlight === 1, {
      message: "the child's request to reach the stand-in",
    });
    expect(limiter.stats()).toMatchObject({ active: 1 });
    const reason = new Error('the user left');
    controller.abort(reason);
    expect(await run).toBe(reason);
    // The child got the parent's cancellation, not an error of its own.
    expect(childOutcome).toBe(reason);
    await p.idle();
    expect(p.requests[1]).toMatchObject({ aborted: true, done: false });
    // Nothing after the cancel: the parent asked no more of the provider.
    expect(p.requests).toHaveLength(2);
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });

  it("on the parent's limiter keeps the parent's workload, whatever the child agent's own default (C33)", async () => {
    const childHeld = deferred();
    const childArrived = deferred();
    const p = await parentAndChild(async () => {
      childArrived.resolve();
      await childHeld.promise;
      return { text: 'a fact' };
    });
    const limiter = f.limiter({
      name: 'shared',
      maxConcurrent: 2,
      workloads: { interactive: {}, batch: {} },
    });
    const model = f.model(p);
    const { credentials, clock } = f;
    // The child agent's own default is `batch`; the parent runs in `interactive`.
    const child = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the child.',
      concurrency: { limiter, workload: 'batch' },
    });
    const parent = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the parent.',
      concurrency: { limiter, workload: 'interactive' },
      tools: [askChild(() => child.run({ prompt: 'a fact, please' }))],
    });
    const log = eventLog();
    const run = parent.run({ prompt: 'go', events: { onConcurrency: log.onConcurrency } });
    await childArrived.promise;
    // The child holds one slot of `interactive`; the parent, waiting on its tool, holds none.
    expect(limiter.stats()).toMatchObject({
      active: 1,
      workloads: { interactive: { active: 1 }, batch: { active: 0 } },
    });
    childHeld.resolve();
    expect((await run).text).toBe('parent got a fact');
    const acquired = log.of('acquired');
    expect(
      acquired.map((e) => [e.limiter, e.workload, e.parentRunId === undefined ? 'parent' : 'child']),
    ).toEqual([
      ['shared', 'interactive', 'parent'],
      ['shared', 'interactive', 'child'],
      ['shared', 'interactive', 'parent'],
    ]);
  });

  it('on the same limiter with a workload it picks takes its slots under that workload, counted on the one limiter (C33)', async () => {
    const childHeld = deferred();
    const childArrived = deferred();
    const p = await parentAndChild(async () => {
      childArrived.resolve();
      await childHeld.promise;
      return { text: 'a fact' };
    });
    // One slot in all: while the child holds it, no other run of the limiter gets one.
    const limiter = f.limiter({
      name: 'shared',
      maxConcurrent: 1,
      workloads: { interactive: {}, batch: {} },
    });
    const model = f.model(p);
    const { credentials, clock } = f;
    const child = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the child.',
      concurrency: { limiter, workload: 'interactive' },
    });
    const parent = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the parent.',
      concurrency: { limiter, workload: 'interactive' },
      tools: [askChild(() => child.run({ prompt: 'a fact, please', concurrency: { workload: 'batch' } }))],
    });
    const log = eventLog();
    const run = parent.run({ prompt: 'go', events: { onConcurrency: log.onConcurrency } });
    await childArrived.promise;
    expect(limiter.stats()).toMatchObject({
      active: 1,
      queued: 0,
      workloads: { interactive: { active: 0 }, batch: { active: 1 } },
    });
    // Another parent run on the limiter waits for the child's slot: the child counts there.
    const other = parent.run({ prompt: 'go again', events: { onConcurrency: log.onConcurrency } });
    await until(() => limiter.stats().queued === 1, { message: 'the other run to queue' });
    expect(log.of('acquired')).toHaveLength(2);
    childHeld.resolve();
    expect((await run).text).toBe('parent got a fact');
    expect((await other).text).toBe('parent got a fact');
    const childAcquired = log.of('acquired').filter((e) => e.parentRunId !== undefined);
    expect(childAcquired.map((e) => [e.limiter, e.workload])).toEqual([
      ['shared', 'batch'],
      ['shared', 'batch'],
    ]);
  });

  it("on another limiter takes its slots there and none of its parent's limiter (C36)", async () => {
    const childHeld = deferred();
    const childArrived = deferred();
    const p = await parentAndChild(async () => {
      childArrived.resolve();
      await childHeld.promise;
      return { text: 'a fact' };
    });
    const parents = f.limiter({ name: 'parents', maxConcurrent: 1, workloads: { interactive: {} } });
    const children = f.limiter({ name: 'children', maxConcurrent: 1, workloads: { cheap: {}, other: {} } });
    const model = f.model(p);
    const { credentials, clock } = f;
    const child = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the child.',
      concurrency: { limiter: children, workload: 'cheap' },
    });
    const parent = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are the parent.',
      concurrency: { limiter: parents, workload: 'interactive' },
      tools: [askChild(() => child.run({ prompt: 'a fact, please' }))],
    });
    const log = eventLog();
    const run = parent.run({ prompt: 'go', events: { onConcurrency: log.onConcurrency } });
    await childArrived.promise;
    expect(children.stats()).toMatchObject({ active: 1, workloads: { cheap: { active: 1 } } });
    expect(parents.stats()).toMatchObject({ active: 0, queued: 0 });
    // The parent's limiter is free while the child works: a plain run of `parents` gets its
    // slot now (the stand-in answers it: its system prompt is not the child's).
    const plain = createAgent({
      model,
      credentials,
      clock,
      instructions: 'You are plain.',
      concurrency: { limiter: parents },
    });
    expect((await plain.run({ prompt: 'now' })).text).toBe('a plain answer');
    childHeld.resolve();
    expect((await run).text).toBe('parent got a fact');
    const childAcquired = log.of('acquired').filter((e) => e.parentRunId !== undefined);
    expect(childAcquired.map((e) => [e.limiter, e.workload])).toEqual([['children', 'cheap']]);
    expect(
      log
        .of('acquired')
        .filter((e) => e.parentRunId === undefined)
        .map((e) => e.limiter),
    ).toEqual(['parents', 'parents']);
  });
});
