import { describe, expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { AgentFixture, guard, until, useAgentFixture } from './fixture.js';

useAgentFixture();

describe('the leak guard of the agent tests', () => {
  it('fails a test that leaves a slot held, a request in flight, a timer pending or a listener attached', async () => {
    // A fixture of its own, not the file's: its leaks are checked here, not after the test.
    const nested = new AgentFixture();
    try {
      const p = await nested.provider({ reply: () => ({ stall: true }) });
      const limiter = nested.limiter();
      const agent = createAgent({
        model: nested.model(p),
        credentials: nested.credentials,
        concurrency: { limiter },
        clock: nested.clock,
        bounds: { turnTimeoutMs: 60_000 },
      });
      const controller = nested.controller();
      // The leak: a run left going when the test would end.
      const run = agent.run({ prompt: 'hi', signal: controller.signal }).catch((e: unknown) => e);
      await until(() => p.inFlight === 1, { message: 'the request to reach the stand-in' });

      // The request stalls for good, so a short settle cannot make this flaky.
      expect(await nested.leaks({ settleMs: 20 })).toEqual([
        'limiter `default` has 1 slots held and 0 queued',
        `the stand-in on port ${p.port} has 1 requests in flight`,
        '1 ManualClock timers pending (60000 ms)',
        '1 abort listeners on signals given to runs',
      ]);
      await expect(guard(nested, { settleMs: 20 })).rejects.toThrow(
        /^Leak guard: the test left limiter `default` has 1 slots held/,
      );

      // Ending the run takes everything back, and the guard is satisfied.
      controller.abort(new Error('done with it'));
      await run;
      expect(await nested.leaks()).toEqual([]);
      await expect(guard(nested)).resolves.toBeUndefined();
    } finally {
      await nested.close();
    }
  });

  it('ignores background timers (lease sweeps and renewals keep no process alive)', async () => {
    const nested = new AgentFixture();
    const limiter = nested.limiter();
    await limiter.release(await limiter.acquire());
    nested.clock.setTimeout(() => undefined, 1000, { background: true });
    expect(await nested.leaks()).toEqual([]);
    await nested.close();
  });
});
