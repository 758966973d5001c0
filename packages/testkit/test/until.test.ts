import { describe, expect, it } from 'vitest';
import { until } from '@sluice/testkit';

describe('until', () => {
  it('resolves on the turn the condition starts to hold, without waiting for time', async () => {
    let turns = 0;
    const done = until(() => turns >= 3);
    const log: string[] = [];
    void done.then(() => log.push(`resolved after ${turns} turns`));
    for (let i = 0; i < 5; i++) {
      turns++;
      await new Promise((resolve) => setImmediate(resolve));
    }
    await done;
    expect(log).toEqual(['resolved after 3 turns']);
  });

  it('gives up with a message that names what never happened', async () => {
    await expect(
      until(() => false, { giveUpMs: 0, message: 'the stand-in to see a request' }),
    ).rejects.toThrow('until: gave up after 0 ms waiting for the stand-in to see a request');
  });

  it('waits for an async condition, each check after the previous one has answered', async () => {
    let answers = 0;
    let inFlight = 0;
    let overlapped = false;
    await until(
      async () => {
        overlapped ||= inFlight > 0;
        inFlight++;
        await new Promise((resolve) => setImmediate(resolve));
        inFlight--;
        return ++answers === 4;
      },
      { everyMs: 1 },
    );
    expect({ answers, overlapped }).toEqual({ answers: 4, overlapped: false });
  });

  it('gives up on an async condition that never holds, naming it', async () => {
    await expect(
      until(async () => false, { giveUpMs: 0, everyMs: 1, message: 'the run to end' }),
    ).rejects.toThrow('until: gave up after 0 ms waiting for the run to end');
  });
});
