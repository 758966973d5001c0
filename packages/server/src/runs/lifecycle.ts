/**
 * The run lifecycle, drawn once. Every SQL statement that moves a run checks the status it
 * moves from (compare-and-set), so no two processes can make two moves from one state.
 *
 *   scheduled ──due──▶ queued ──claimed──▶ running ──▶ succeeded
 *       │                │                   │    └──▶ failed   (agent_error, timeout, max_duration_exceeded,
 *       │                │                   │                   worker_lost, interrupted)
 *       │                └──not started in time (deferred)──▶ failed (expired)
 *       └──not promoted in time──────────────────────────────▶ failed (expired)
 *                                         running ──a tool needs approval──▶ requires_action
 *   requires_action ──resume──▶ queued (keeps its place and its thread; no cap refuses it)
 *   scheduled, queued, requires_action ──cancel──▶ canceled      (at once)
 *   running ──cancel──▶ cancel requested ──its process stops it──▶ canceled
 *
 * A canceled run that is still executing somewhere keeps counting for its caps until the
 * process executing it confirms, so cancelling through another server frees nothing early.
 *
 * A run in requires_action waits for a person, with no expiry: it holds no worker, no
 * provider slot and no place in the tenant's concurrency cap (which counts queued and running
 * runs), but it keeps its thread, and it is not final (no callback until it ends).
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

/** States a cancel ends at once: nothing is executing them. */
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
