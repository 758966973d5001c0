import type { RunClass } from './states.js';

/** Why a run was not admitted. The HTTP layer turns each into its 429 (see http/errors.ts). */
export type Refusal =
  | {
      kind: 'concurrency';
      scope: 'tenant' | 'project' | 'user';
      class: RunClass;
      limit: 'max_active_runs' | 'max_queued_runs' | 'max_scheduled_runs' | 'max_concurrent_per_user';
      limitValue: number;
      active: number;
      /** When a place is likely to be free (see retry-after.ts). */
      retryAfterMs?: number;
    }
  | { kind: 'quota'; class: RunClass; limitValue: number; used: number }
  | { kind: 'spend'; class: RunClass; limitUsd: number; spentUsd: number; reservedUsd: number }
  /** A held run lost the thread it took before admission (its lease ran out meanwhile). */
  | { kind: 'thread'; threadId: string };
