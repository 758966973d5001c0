import { expect, it } from 'vitest';
import { runDemo } from './demo.js';

it('the demo keeps the provider within the limit and finishes every run', async () => {
  const frames: string[] = [];
  const summary = await runDemo({ durationMs: 4_000, speed: 0.1, render: (f) => frames.push(f) });
  expect(summary.providerPeakInFlight).toBeGreaterThan(0);
  expect(summary.providerPeakInFlight).toBeLessThanOrEqual(summary.limit);
  expect(summary.failed).toBe(0);
  expect(summary.runs.interactive).toBeGreaterThan(0);
  expect(summary.runs.background).toBeGreaterThan(0);
  // Each writer run: two turns of its own and two researcher requests.
  expect(summary.providerRequests).toBe(4 * (summary.runs.interactive + summary.runs.background));
  expect(frames.at(-1)).toContain('at the provider now 0');
}, 60_000);
