/**
 * The words of the run lifecycle: its states and classes, and which states are final. Pure, so
 * every layer can name a state without loading the SQL; the moves between states, drawn and
 * written out, are in lifecycle.ts.
 */
export const runStatuses = [
  'scheduled',
  'queued',
  'running',
  'requires_action',
  'succeeded',
  'failed',
  'canceled',
] as const;
export type RunStatus = (typeof runStatuses)[number];

export const finalStatuses = ['succeeded', 'failed', 'canceled'] as const satisfies readonly RunStatus[];
export type FinalStatus = (typeof finalStatuses)[number];

export const isFinal = (status: string): status is FinalStatus =>
  (finalStatuses as readonly string[]).includes(status);

/** A waiting caller has its answer: the run ended, or it waits for a person. */
export const isSettled = (status: string): boolean => isFinal(status) || status === 'requires_action';

/** States a cancel ends at once: nothing is executing them (see `cancelNotStarted`). */
export const cancelableAtOnce = [
  'scheduled',
  'queued',
  'requires_action',
] as const satisfies readonly RunStatus[];

/** Why a run failed, as `error.type`. */
export type FailureType =
  'agent_error' | 'timeout' | 'max_duration_exceeded' | 'worker_lost' | 'interrupted' | 'expired';

export const runClasses = ['default', 'deferred'] as const;
export type RunClass = (typeof runClasses)[number];

/** A list of states as SQL text (`'a', 'b'`), so a statement spells a set the way this file does. */
export const sqlList = (statuses: readonly RunStatus[]): string => statuses.map((s) => `'${s}'`).join(', ');
