import { SECOND } from '../concurrency/clock.js';
import { modelDefaults } from '../models/defaults.js';

/**
 * Every default of the agent runtime (agents, runs and model specs), in one place. The
 * limiter's own defaults live beside its options (`limiterDefaults`).
 */
export const agentDefaults = Object.freeze({
  bounds: Object.freeze({ maxParallelToolCalls: 10 }),
  retry: Object.freeze({ maxRetries: 3, baseDelayMs: 500, maxDelayMs: 30 * SECOND }),
  maxRepairs: 2,
  compaction: Object.freeze({ keepLast: 6 }),
  // Kept beside the model specs, so that models/ needs nothing from agent/.
  model: modelDefaults,
});

/**
 * The longest delay a Node timer can take (about 24.8 days). Node fires a longer timer after
 * 1 ms instead, so a timeout above it would end at once: such options are refused.
 */
export const maxTimerMs = 2_147_483_647;
