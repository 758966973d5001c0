import { until as untilHolds } from '@sluice/testkit';

/**
 * Waits until `check` holds: testkit's `until`, asking every 25 ms (a check here usually
 * queries a server or its database) and giving up after 20 s, with `what` in the failure.
 */
export function until(check: () => Promise<boolean> | boolean, what = 'condition'): Promise<void> {
  return untilHolds(check, { everyMs: 25, giveUpMs: 20_000, message: what });
}
