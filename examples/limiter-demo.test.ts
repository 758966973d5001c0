import { expect, it } from 'vitest';
import { runDemo } from './limiter-demo.js';

it('the demo keeps to its limit and finishes every request', async () => {
  const frames: string[] = [];
  const summary = await runDemo({ durationMs: 3_000, speed: 0.1, render: (f) => frames.push(f) });
  expect(summary.peakInFlight).toBeGreaterThan(0);
  expect(summary.peakInFlight).toBeLessThanOrEqual(summary.limit);
  expect(summary.rejected).toBe(0);
  expect(summary.completed.interactive).toBeGreaterThan(0);
  expect(summary.completed.background).toBeGreaterThan(0);
  expect(frames.at(-1)).toContain('in flight');
});
