import { describe, expect, it } from 'vitest';
import { ManualClock } from 'sluice/concurrency';
import { PollSchedule } from '../../src/poll-schedule.js';

describe('PollSchedule', () => {
  const setUp = (next: { intervalMs: number; nextExpiryAt: number; due: boolean }) => {
    const clock = new ManualClock(0);
    const polls: number[] = [];
    let finish: (() => void) | undefined;
    const schedule = new PollSchedule(
      clock,
      () => {
        polls.push(clock.now());
        return new Promise<void>((resolve) => (finish = resolve));
      },
      () => next,
    );
    const done = async () => {
      finish?.();
      await new Promise((r) => setImmediate(r));
    };
    return { clock, polls, schedule, next, done };
  };

  it('polls at the interval, or at the next lease expiry when that is sooner, with no margin', async () => {
    const { clock, polls, schedule, next, done } = setUp({ intervalMs: 100, nextExpiryAt: 40, due: true });
    schedule.arm();
    schedule.arm(); // still one timer
    expect(clock.pendingTimers).toBe(1);
    clock.advance(40);
    expect(polls).toEqual([40]);
    next.nextExpiryAt = Infinity;
    await done(); // the poll ends and arms the next one
    clock.advance(100);
    expect(polls).toEqual([40, 140]);
  });

  it('never two polls at once, and nothing when no poll is due', async () => {
    const { clock, polls, schedule, next, done } = setUp({
      intervalMs: 100,
      nextExpiryAt: Infinity,
      due: true,
    });
    void schedule.now();
    void schedule.now();
    expect(polls).toEqual([0]);
    next.due = false;
    await done();
    expect(clock.pendingTimers).toBe(0);
    schedule.arm();
    expect(clock.pendingTimers).toBe(0);
  });

  it('a sooner time replaces a later timer; cancel clears it', () => {
    const { clock, schedule, next } = setUp({ intervalMs: 1000, nextExpiryAt: Infinity, due: true });
    schedule.arm();
    next.intervalMs = 100;
    schedule.arm();
    expect(clock.pendingTimers).toBe(1);
    schedule.cancel();
    expect(clock.pendingTimers).toBe(0);
  });
});
